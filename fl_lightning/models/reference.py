"""The papers' reference models: logistic regression, the 2-layer MLP ("2NN"), small CNNs.

All are FedProx-, SCAFFOLD- and FedDyn-ready (:class:`~fl_lightning.ProximalMixin` and
:class:`~fl_lightning.LinearTermMixin` are inert until an algorithm sets their terms).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from fl_lightning.mixins.linear_term import LinearTermMixin
from fl_lightning.mixins.proximal import ProximalMixin
from fl_lightning.models.classifier import ClassificationModule
from fl_lightning.utils.checks import check_sizes


class LogisticRegression(LinearTermMixin, ProximalMixin, ClassificationModule):
    """Multinomial logistic regression (e.g. FedProx's Synthetic(α, β) experiments: 60 → 10)."""

    def __init__(self, *, in_features: int = 60, num_classes: int = 10, **kwargs: Any) -> None:
        super().__init__(num_classes=num_classes, **kwargs)
        check_sizes(in_features=in_features)
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(in_features, num_classes))


class MLP(LinearTermMixin, ProximalMixin, ClassificationModule):
    """Fully connected ReLU network; the default is McMahan et al.'s "2NN" (784-200-200-10)."""

    def __init__(
        self, *, in_features: int = 784, hidden: tuple[int, ...] = (200, 200), num_classes: int = 10, **kwargs: Any
    ) -> None:
        super().__init__(num_classes=num_classes, **kwargs)
        check_sizes(in_features=in_features)
        if any(isinstance(width, bool) or not isinstance(width, int) or width < 1 for width in hidden):
            raise ValueError(f"`hidden` must be layer widths >= 1 (empty for no hidden layer), got {list(hidden)}.")
        layers: list[nn.Module] = [nn.Flatten()]
        for width_in, width_out in zip((in_features, *hidden), hidden):
            layers += [nn.Linear(width_in, width_out), nn.ReLU()]
        layers.append(nn.Linear(hidden[-1] if hidden else in_features, num_classes))
        self.net = nn.Sequential(*layers)


class CNN(LinearTermMixin, ProximalMixin, ClassificationModule):
    """McMahan et al.'s CNN: two 5×5 conv layers (32, 64 channels, "same" padding) with 2×2 max-pooling,
    a 512-unit dense layer and a linear output; optional BatchNorm after each convolution.

    Args:
        in_channels: image channels.
        image_size: height = width of the input images (must be divisible by 4).
        batch_norm: add ``BatchNorm2d`` after each convolution.
    """

    def __init__(
        self,
        *,
        in_channels: int = 1,
        image_size: int = 28,
        num_classes: int = 10,
        batch_norm: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(num_classes=num_classes, **kwargs)
        check_sizes(in_channels=in_channels, image_size=image_size)
        if image_size % 4:
            raise ValueError(f"`image_size` must be divisible by 4 (two 2x2 poolings), got {image_size}.")

        def block(c_in: int, c_out: int) -> list[nn.Module]:
            norm: list[nn.Module] = [nn.BatchNorm2d(c_out)] if batch_norm else []
            return [nn.Conv2d(c_in, c_out, 5, padding=2), *norm, nn.ReLU(), nn.MaxPool2d(2)]

        self.net = nn.Sequential(
            *block(in_channels, 32),
            *block(32, 64),
            nn.Flatten(),
            nn.Linear(64 * (image_size // 4) ** 2, 512),
            nn.ReLU(),
            nn.Linear(512, num_classes),
        )


class PflCNN(LinearTermMixin, ProximalMixin, ClassificationModule):
    """pfl-research's CIFAR-10 benchmark CNN (``simple_cnn`` in ``benchmarks/model/pytorch/cnn.py`` of
    https://github.com/apple/pfl-research): two unpadded 3×3 conv layers (32, 64 channels, ReLU), one
    2×2 max-pooling, dropout 0.25, a 128-unit dense layer, dropout 0.5 and a linear output; Xavier
    (Glorot) uniform weights, PyTorch's default biases. 1,626,442 parameters on 3×32×32 inputs.

    pfl-research trains it with local SGD at lr 0.1, batch 10, 1 local epoch, 50 of 1000 clients
    (50 images each) per round and central SGD at lr 1 (``image_classification/configs/baseline.yaml``).
    Their model takes channels-last ``[N, H, W, C]`` images and transposes them; this one takes
    channels-first ``[N, C, H, W]``, as :class:`~fl_lightning.data.CIFAR10` serves them.

    Args:
        in_channels: image channels.
        image_size: height = width of the input images (at least 6).
    """

    def __init__(self, *, in_channels: int = 3, image_size: int = 32, num_classes: int = 10, **kwargs: Any) -> None:
        super().__init__(num_classes=num_classes, **kwargs)
        check_sizes(in_channels=in_channels, image_size=image_size)
        if image_size < 6:
            raise ValueError(f"`image_size` must be >= 6 (two unpadded 3x3 convolutions and a 2x2 pooling), got {image_size}.")
        pooled = (image_size - 4) // 2
        self.net = nn.Sequential(
            nn.Conv2d(in_channels, 32, 3),
            nn.ReLU(),
            nn.Conv2d(32, 64, 3),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Dropout(0.25),
            nn.Flatten(),
            nn.Linear(64 * pooled**2, 128),
            nn.ReLU(),
            nn.Dropout(0.5),
            nn.Linear(128, num_classes),
        )
        for layer in self.net:
            if isinstance(layer, (nn.Conv2d, nn.Linear)):
                nn.init.xavier_uniform_(layer.weight)


class EmnistCNN(PflCNN):
    """Reddi et al. 2021's EMNIST character-recognition CNN (App. C.2; ``create_conv_dropout_model`` in
    ``utils/models/emnist_models.py`` of https://github.com/google-research/federated): :class:`PflCNN`'s
    layers on 1×28×28 images with 62 classes (1,206,590 parameters), weights Glorot *normal* as there.
    """

    def __init__(self, *, in_channels: int = 1, image_size: int = 28, num_classes: int = 62, **kwargs: Any) -> None:
        super().__init__(in_channels=in_channels, image_size=image_size, num_classes=num_classes, **kwargs)
        for layer in self.net:
            if isinstance(layer, (nn.Conv2d, nn.Linear)):
                nn.init.xavier_normal_(layer.weight)
