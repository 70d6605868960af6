"""ResNet-18 with GroupNorm: Reddi et al. 2021's CIFAR-100 model (App. C.1).

The authors' code (https://github.com/google-research/federated, ``utils/models/resnet_models.py``,
``create_resnet18``) builds a pre-activation ResNet (He et al. 2016b, "ResNet v2") with every BatchNorm
replaced by GroupNorm, which keeps no statistics that client data would skew (Hsieh et al. 2020).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from fl_lightning.data.augment import per_image_standardization
from fl_lightning.mixins.proximal import ProximalMixin
from fl_lightning.models.classifier import ClassificationModule
from fl_lightning.utils.checks import check_integer, check_sizes, optional


class _PreActBlock(nn.Module):
    """``conv3x3(relu(norm(x)))`` twice plus the shortcut (a 1×1 conv and a norm where the width changes).

    The first block after the stem skips its first norm and ReLU: the stem has just applied them.
    """

    def __init__(self, c_in: int, c_out: int, *, groups: int, eps: float, first: bool) -> None:
        super().__init__()

        def norm(channels: int) -> nn.GroupNorm:
            return nn.GroupNorm(groups, channels, eps=eps)

        self.pre = nn.Identity() if first else nn.Sequential(norm(c_in), nn.ReLU())
        self.conv1 = nn.Conv2d(c_in, c_out, 3, padding=1, bias=False)
        self.conv2 = nn.Sequential(norm(c_out), nn.ReLU(), nn.Conv2d(c_out, c_out, 3, padding=1, bias=False))
        self.shortcut = (
            nn.Identity() if c_in == c_out else nn.Sequential(nn.Conv2d(c_in, c_out, 1, bias=False), norm(c_out))
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.shortcut(x) + self.conv2(self.conv1(self.pre(x)))


class ResNet18GN(ProximalMixin, ClassificationModule):
    """The reference's ResNet-18: a 7×7 stride-2 stem (conv, norm, ReLU) and 3×3 stride-2 max-pooling,
    four stages of two pre-activation basic blocks (64, 128, 256, 512 channels), a final norm and ReLU,
    global average pooling and a linear output. Convolutions carry no bias; 11,227,812 parameters for
    100 classes, the reference's count.

    Choices that follow the reference code rather than the ImageNet ResNet: the stages do not downsample
    (its ``_residual_block`` is never given a stride, so a 24×24 crop is 6×6 from the stem to the pooling);
    GroupNorm's epsilon is Keras' 1e-3. Convolutions start He normal, the output N(0, 0.01²) with zero bias.
    The reference adds an L2 penalty of 1e-4 through Keras regularisers; here that is ``weight_decay``
    (off by default, as TFF's training loop leaves Keras' regularisation losses out).

    The reference's input pipeline (``build_image_map`` of TFF's and Reddi et al.'s CIFAR-100 preprocessing)
    is :meth:`preprocess`, the first step of :meth:`forward`: with ``crop``, each training image is cropped at
    a uniformly random offset and mirrored left-right with probability 1/2 (``tf.image.random_crop``,
    ``random_flip_left_right``), each evaluated image cropped centrally (``resize_with_crop_or_pad``); then,
    with ``standardize``, each crop is standardised on its own
    (:func:`~fl_lightning.data.augment.per_image_standardization`, the formula taken on the ``0-255`` pixel
    values, as the reference casts the ``uint8`` image to float: inputs are expected in ``[0, 1]``, as
    :class:`~fl_lightning.data.datasets.tff.TffCIFAR100` gives them). The draws come from torch's global
    generator, as dropout's do.

    Args:
        in_channels: image channels.
        num_classes: number of classes.
        groups: GroupNorm groups per layer (Reddi et al.: 2).
        crop: side of the square crop taken from every image (``None``: the whole image).
        standardize: standardise each (cropped) image, as the reference does (``False``: feed the inputs as
            they come, e.g. data already normalised another way).
    """

    def __init__(
        self,
        *,
        in_channels: int = 3,
        num_classes: int = 100,
        groups: int = 2,
        crop: int | None = 24,
        standardize: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(num_classes=num_classes, **kwargs)
        check_sizes(in_channels=in_channels, groups=groups)
        if 64 % groups:
            raise ValueError(f"`groups` must divide every layer's width (64, 128, 256, 512), got {groups}.")
        optional(check_integer, "crop", crop, minimum=1)
        self.crop = crop
        self.standardize = bool(standardize)
        eps = 1e-3
        widths = [64, 64, 64, 128, 128, 256, 256, 512, 512]
        blocks = [
            _PreActBlock(c_in, c_out, groups=groups, eps=eps, first=i == 0) for i, (c_in, c_out) in enumerate(zip(widths, widths[1:]))
        ]
        self.net = nn.Sequential(
            nn.Conv2d(in_channels, 64, 7, stride=2, padding=3, bias=False),
            nn.GroupNorm(groups, 64, eps=eps),
            nn.ReLU(),
            nn.MaxPool2d(3, stride=2, padding=1),
            *blocks,
            nn.GroupNorm(groups, 512, eps=eps),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(512, num_classes),
        )
        for m in self.net.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, nonlinearity="relu")
        nn.init.normal_(self.net[-1].weight, 0.0, 0.01)
        nn.init.zeros_(self.net[-1].bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.net(self.preprocess(x))

    def preprocess(self, x: Tensor) -> Tensor:
        """The reference's input pipeline on a batch of ``[0, 1]`` images: the crop (random and maybe mirrored
        in training, central in evaluation), then per-image standardisation of the ``0-255`` values."""
        if self.crop is not None:
            x = self._cropped(x, self.crop)
        return per_image_standardization(x, scale=255.0) if self.standardize else x

    def _cropped(self, x: Tensor, size: int) -> Tensor:
        n, _, h, w = x.shape
        if size > min(h, w):
            raise ValueError(f"`crop`={size} is larger than the {h}x{w} images.")
        if not self.training:  # central, as tf.image.resize_with_crop_or_pad
            top, left = (h - size) // 2, (w - size) // 2
            return x[..., top : top + size, left : left + size]
        window = torch.arange(size, device=x.device)
        rows = torch.randint(0, h - size + 1, (n, 1), device=x.device) + window
        cols = torch.randint(0, w - size + 1, (n, 1), device=x.device) + window
        samples = torch.arange(n, device=x.device)[:, None, None, None]
        channels = torch.arange(x.shape[1], device=x.device)[None, :, None, None]
        cropped = x[samples, channels, rows[:, None, :, None], cols[:, None, None, :]]
        mirrored = torch.rand(n, device=x.device) < 0.5
        return torch.where(mirrored[:, None, None, None], cropped.flip(-1), cropped)
