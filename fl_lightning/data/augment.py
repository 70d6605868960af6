"""Seeded, tensor-level training augmentation for in-memory image datasets.

The in-memory datasets skip torchvision's per-sample PIL transforms (see
:mod:`fl_lightning.data.datasets.vision`), so augmentation is applied to whole batches of
normalised tensors instead, from a generator that the client's data seed fixes: the same run
sees the same augmented samples, whatever the device or the executor.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from fl_lightning.data._data_checks import check_int
from fl_lightning.utils.seeding import derive_seed


class RandomCropFlip:
    """``RandomCrop(size, padding)`` then ``RandomHorizontalFlip(0.5)``, per sample, on ``[B, C, H, W]`` batches.

    The image is padded by ``padding`` pixels of ``fill`` (per channel) on every side, and a window
    of the original size is taken at an offset drawn uniformly in ``[0, 2 * padding]`` in each
    direction; then the sample is mirrored left-right with probability 1/2. It is the CIFAR
    augmentation of the FedMRN authors' code (``RandomCrop(32, padding=4)``,
    ``RandomHorizontalFlip()``); ``fill`` is the normalised value of a black pixel,
    ``-mean / std``, so padding matches torchvision's zero padding before normalisation.

    Args:
        padding: Pixels of padding on each side (>= 0).
        fill: Per-channel padding value of the normalised images.
        flip: Whether to mirror horizontally with probability 1/2.
    """

    def __init__(self, *, padding: int = 4, fill: Sequence[float] = (0.0,), flip: bool = True) -> None:
        self.padding = check_int("padding", padding, minimum=0)
        self.fill = tuple(float(f) for f in fill)
        if not self.fill:
            raise ValueError("`fill` must give at least one value (one per channel, or one for all).")
        self.flip = bool(flip)

    def __call__(self, images: Tensor, generator: torch.Generator) -> Tensor:
        """The augmented batch; draws offsets then flips from ``generator`` (a CPU generator)."""
        if images.ndim != 4:
            raise ValueError(f"RandomCropFlip expects images [B, C, H, W], got shape {list(images.shape)}.")
        b, c, h, w = images.shape
        if len(self.fill) not in (1, c):
            raise ValueError(f"`fill` has {len(self.fill)} values for images with {c} channels.")
        p = self.padding
        dy = torch.randint(0, 2 * p + 1, (b,), generator=generator)
        dx = torch.randint(0, 2 * p + 1, (b,), generator=generator)
        mirrored = torch.rand(b, generator=generator) < 0.5 if self.flip else torch.zeros(b, dtype=torch.bool)
        device = images.device
        fill = torch.tensor(self.fill, dtype=images.dtype, device=device).expand(c).view(1, c, 1, 1)
        # Pad with zeros, then paint the border with the per-channel fill value.
        padded = F.pad(images, (p, p, p, p))
        if p:
            border = torch.ones(1, 1, h + 2 * p, w + 2 * p, dtype=torch.bool, device=device)
            border[..., p : p + h, p : p + w] = False
            padded = torch.where(border, fill, padded)
        columns = torch.arange(w)
        columns = torch.where(mirrored[:, None], columns.flip(0)[None, :], columns[None, :]) + dx[:, None]
        rows = torch.arange(h)[None, :] + dy[:, None]
        index = torch.arange(b)[:, None, None]
        # padded[b, :, rows[b, i], columns[b, j]] -> [B, H, W, C] -> [B, C, H, W]
        out = padded.permute(0, 2, 3, 1)[index.to(device), rows[:, :, None].to(device), columns[:, None, :].to(device)]
        return out.permute(0, 3, 1, 2).contiguous()


def augmentation_generator(data_generator: torch.Generator) -> torch.Generator:
    """A CPU generator for a client's augmentation draws, fixed by the seed of its data-order
    generator (read with ``initial_seed``, so the data order's stream is not consumed)."""
    return torch.Generator().manual_seed(derive_seed(data_generator.initial_seed(), "augment"))


def per_image_standardization(images: Tensor, *, scale: float = 1.0) -> Tensor:
    """TensorFlow's ``tf.image.per_image_standardization`` on a batch ``[B, ...]``, image by image.

    Each image's ``N`` values (all channels and pixels together) become ``(x - mean) / max(stddev, 1 / sqrt(N))``,
    the population standard deviation (as TensorFlow's, over ``N``, not ``N - 1``); the floor keeps a flat
    image from being divided by zero. Reddi et al.'s and TFF's CIFAR-100 preprocessing apply it to the
    ``float32`` cast of the ``uint8`` pixels (``0-255``) after the crop
    (``tff.simulation.baselines.cifar100.image_classification_preprocessing.build_image_map``).

    Args:
        images: The batch, ``B`` images of any shape.
        scale: What the formula's values were divided by to give ``images`` (``255`` for images in ``[0, 1]``
            made from 8-bit pixels): the result is the formula's on ``images * scale``. It matters only
            through the floor, which applies to low-contrast images (standard deviation under
            ``1 / sqrt(N)`` of a pixel step).
    """
    if images.ndim < 2:
        raise ValueError(f"per_image_standardization expects a batch [B, ...] of images, got shape {list(images.shape)}.")
    if not scale > 0:
        raise ValueError(f"`scale` must be > 0, got {scale}.")
    # In float64 where the device has it: a flat image of float32 [0, 1] values is otherwise off by 6e-4
    # (the mean's rounding divided by the floor), where the formula gives exactly 0.
    wide = torch.float32 if images.device.type == "mps" else torch.float64
    flat = images.reshape(len(images), -1).to(wide)
    mean = flat.mean(dim=1, keepdim=True)
    std = flat.var(dim=1, unbiased=False, keepdim=True).sqrt()
    floor = 1.0 / (scale * flat.shape[1] ** 0.5)
    out = torch.float32 if not images.is_floating_point() else images.dtype
    return ((flat - mean) / std.clamp(min=floor)).reshape(images.shape).to(out)
