"""The FedMRN paper's models (Li et al. 2024, §4.1; exact shapes from the authors' ``model/cnn.py``).

``CNN4``, ``CNN8`` and ``MaskedMLP`` are FedMRN-ready: :class:`~fl_lightning.mixins.MaskedNoiseMixin`
is inert until an algorithm such as :class:`~fl_lightning.algorithms.FedMRN` starts a round, so the
same class trains under FedAvg or a compression baseline. Their ``ProbabilityMasked*`` twins are the
same networks with :class:`~fl_lightning.mixins.ProbabilityMaskMixin`, for the FedPM baseline
(:class:`~fl_lightning.algorithms.FedPM`): always masked random networks.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise
from typing import Any

import torch
from torch import nn

from fl_lightning.mixins.masked_noise import MaskedNoiseMixin
from fl_lightning.mixins.probability_mask import ProbabilityMaskMixin
from fl_lightning.models.classifier import ClassificationModule
from fl_lightning.models.reference import MLP


def _conv_block(c_in: int, c_out: int, *, pool: bool) -> list[nn.Module]:
    layers: list[nn.Module] = [nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU()]
    return [*layers, nn.MaxPool2d(2)] if pool else layers


class _PaperCNN(ClassificationModule):
    """Bias-free 3x3 conv blocks (conv, BN, ReLU[, max-pool]), flatten, bias-free linear; conv and
    linear weights drawn from N(0, 0.01²) (the authors' init), BatchNorm default."""

    def _build(self, blocks: list[nn.Module], in_channels: int, image_size: int, num_classes: int) -> None:
        pools = sum(isinstance(m, nn.MaxPool2d) for m in blocks)
        if image_size < 2**pools:
            raise ValueError(
                f"`image_size` must be >= {2**pools} for {type(self).__name__}'s {pools} poolings, got {image_size}."
            )
        features = nn.Sequential(*blocks, nn.Flatten())
        with torch.no_grad():
            width = features(torch.zeros(1, in_channels, image_size, image_size)).shape[1]
        self.net = nn.Sequential(*features, nn.Linear(width, num_classes, bias=False))
        for m in self.net.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                nn.init.normal_(m.weight, 0.0, 0.01)


class _CNN4Layers(_PaperCNN):
    """Four blocks of 32, 64, 128, 256 channels, each pooled (FMNIST 1x28x28: 389,920 masked
    weights; SVHN 3x32x32: 398,176).

    Args:
        in_channels: image channels.
        image_size: height = width of the input images (>= 2 ** len(channels): 16 for CNN4).
        num_classes: number of classes.
        channels: output channels of the pooled blocks; the paper's CNN4 by default. Fewer blocks
            make a stand-in for small images, e.g. ``(32, 64, 128)`` for the 8x8 digits.
        **kwargs: :class:`~fl_lightning.models.ClassificationModule` arguments (lr, momentum, ...).
    """

    def __init__(
        self,
        *,
        in_channels: int = 1,
        image_size: int = 28,
        num_classes: int = 10,
        channels: Sequence[int] = (32, 64, 128, 256),
        **kwargs: Any,
    ) -> None:
        super().__init__(num_classes=num_classes, **kwargs)
        if not channels or any(isinstance(c, bool) or not isinstance(c, int) or c < 1 for c in channels):
            raise ValueError(f"`channels` must be a non-empty sequence of positive integers, got {channels!r}.")
        self.save_hyperparameters()
        blocks = [m for c_in, c_out in pairwise((in_channels, *channels)) for m in _conv_block(c_in, c_out, pool=True)]
        self._build(blocks, in_channels, image_size, num_classes)


class _CNN8Layers(_PaperCNN):
    """Eight conv blocks of 32, 32, 64, 64, 128, 128, 256, 256 channels, pooled after every second
    (CIFAR 3x32x32: 1,181,536 masked weights for 10 classes, 1,273,696 for 100).

    Args: as :class:`_CNN4Layers`.
    """

    def __init__(self, *, in_channels: int = 3, image_size: int = 32, num_classes: int = 10, **kwargs: Any) -> None:
        super().__init__(num_classes=num_classes, **kwargs)
        self.save_hyperparameters()
        channels = (in_channels, 32, 32, 64, 64, 128, 128, 256, 256)
        blocks = [m for i, (c_in, c_out) in enumerate(pairwise(channels)) for m in _conv_block(c_in, c_out, pool=i % 2 == 1)]
        self._build(blocks, in_channels, image_size, num_classes)


class CNN4(MaskedNoiseMixin, _CNN4Layers):
    """The paper's CNN4 (see :class:`_CNN4Layers`) with :class:`~fl_lightning.mixins.MaskedNoiseMixin`."""


class CNN8(MaskedNoiseMixin, _CNN8Layers):
    """The paper's CNN8 (see :class:`_CNN8Layers`) with :class:`~fl_lightning.mixins.MaskedNoiseMixin`."""


class ProbabilityMaskedCNN4(ProbabilityMaskMixin, _CNN4Layers):
    """The paper's CNN4 as a sparse random network for :class:`~fl_lightning.algorithms.FedPM`
    (conv/linear weights frozen and masked; BatchNorm trained)."""


class ProbabilityMaskedCNN8(ProbabilityMaskMixin, _CNN8Layers):
    """The paper's CNN8 as a sparse random network for :class:`~fl_lightning.algorithms.FedPM`."""


class _BiasFreeMLP(MLP):
    """:class:`~fl_lightning.models.MLP` whose Linear biases can be dropped.

    Args:
        bias: keep the Linear biases (sent in full precision under FedMRN and FedPM); ``False``
            makes the upload pure mask bits, like the paper's bias-free CNNs.
        **kwargs: :class:`~fl_lightning.models.MLP` arguments.
    """

    def __init__(self, *, bias: bool = True, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not bias:
            for m in self.net.modules():
                if isinstance(m, nn.Linear):
                    m.bias = None


class MaskedMLP(MaskedNoiseMixin, _BiasFreeMLP):
    """:class:`~fl_lightning.models.MLP` with :class:`~fl_lightning.mixins.MaskedNoiseMixin` (Linear
    weights masked); for small offline runs such as the digits. Args: as :class:`_BiasFreeMLP`."""


class ProbabilityMaskedMLP(ProbabilityMaskMixin, _BiasFreeMLP):
    """:class:`~fl_lightning.models.MLP` as a sparse random network for :class:`~fl_lightning.algorithms.FedPM`
    (Linear weights frozen and masked). Args: as :class:`_BiasFreeMLP`."""
