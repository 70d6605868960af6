r"""The randomized Hadamard rotation of DRIVE and EDEN: a fast Walsh–Hadamard transform after
random sign flips, on any device.

For :math:`D = 2^k`, :math:`R = \tfrac{1}{\sqrt D} H_D \operatorname{diag}(s)` with :math:`H_D` the
Sylvester Hadamard matrix (entries :math:`\pm 1`, ``scipy.linalg.hadamard`` order) and
:math:`s \in \{\pm 1\}^D` drawn from a seed. :math:`R` is orthogonal, so
:math:`R^{-1} = R^\top = \operatorname{diag}(s) \tfrac{1}{\sqrt D} H_D`
(DRIVE §6 "Hadamard", Vargaftik et al., NeurIPS 2021).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def padded_length(numel: int) -> int:
    """The power of two ``D >= max(numel, 1)`` a tensor of ``numel`` elements is padded to."""
    return 1 << max(numel - 1, 0).bit_length()


def fwht(x: Tensor) -> Tensor:
    r"""Orthonormal fast Walsh–Hadamard transform :math:`\tfrac{1}{\sqrt D} H_D x` over the last dimension.

    Iterative butterfly, :math:`O(D \log D)`; the matrix is symmetric and its own inverse.

    Raises:
        ValueError: the last dimension is not a power of two.

    >>> fwht(torch.tensor([1.0, 0.0, 0.0, 0.0]))
    tensor([0.5000, 0.5000, 0.5000, 0.5000])
    """
    n = x.shape[-1]
    if n < 1 or n & (n - 1):
        raise ValueError(f"The Walsh–Hadamard transform needs a power-of-two length, got {n}.")
    lead, y, h = x.shape[:-1], x, 1
    while h < n:
        y = y.reshape(*lead, n // (2 * h), 2, h)
        y = torch.stack((y[..., 0, :] + y[..., 1, :], y[..., 0, :] - y[..., 1, :]), dim=-2)
        h *= 2
    return y.reshape(x.shape) / math.sqrt(n)


def rotation_signs(seed: int, length: int, device: torch.device | str) -> Tensor:
    """The diagonal :math:`s \\in \\{\\pm 1\\}^D` of seed ``seed`` (drawn on the CPU: identical on every device)."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(0, 2, (length,), generator=g) * 2 - 1).float().to(device)


def rotate(x: Tensor, seed: int) -> Tensor:
    r""":math:`R x` for a flat ``x`` zero-padded to :func:`padded_length` (the result has length :math:`D`)."""
    padded = torch.nn.functional.pad(x.reshape(-1), (0, padded_length(x.numel()) - x.numel()))
    return fwht(padded * rotation_signs(seed, padded.numel(), padded.device))


def unrotate(y: Tensor, seed: int) -> Tensor:
    r""":math:`R^{-1} y = R^\top y` for a flat ``y`` of power-of-two length."""
    return fwht(y) * rotation_signs(seed, y.numel(), y.device)
