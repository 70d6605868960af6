r"""Top-k sparsification (Aji & Heafield, EMNLP 2017) with values and indices counted."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from fl_lightning.compression.codec import UpdateCodec
from fl_lightning.compression.wire import PayloadError, TensorSpec, from_le_bytes, to_le_bytes


class TopKCodec(UpdateCodec):
    r"""Keeps the :math:`k = \max(1, \lceil \rho d \rceil)` largest-magnitude entries of each tensor.

    Section: :math:`k` values (``float32``) then their flat indices (``uint32``, increasing):
    :math:`8k` bytes, i.e. :math:`64\rho` bits per element (the paper's Table 1 ignores the index
    cost; we count it). Choices: per-tensor :math:`k`, no error feedback (clients are stateless
    across rounds, as for every other method here); ties broken by ``torch.topk``.

    Args:
        density: :math:`\rho \in (0, 1]`, the kept fraction (the paper: 97 % sparsity, 0.03).
    """

    codec_id = 4

    def __init__(self, *, density: float = 0.03) -> None:
        if not 0.0 < density <= 1.0:
            raise ValueError(f"`density` must be in (0, 1], got {density}.")
        self.density = float(density)

    def k(self, numel: int) -> int:
        """Entries kept from a tensor of ``numel`` elements."""
        return max(1, math.ceil(self.density * numel)) if numel else 0

    def section_size(self, spec: TensorSpec) -> int:
        return 8 * self.k(spec.numel)

    def encode_tensor(self, x: Tensor, generator: torch.Generator | None) -> bytes:
        flat = x.reshape(-1)
        indices = torch.topk(flat.abs(), self.k(flat.numel()), sorted=False).indices.sort().values
        return to_le_bytes(flat[indices], "<f4") + to_le_bytes(indices, "<u4")

    def decode_tensor(self, section: bytes, spec: TensorSpec, device: torch.device | str) -> Tensor:
        k = self.k(spec.numel)
        values = from_le_bytes(section[: 4 * k], "<f4", device)
        indices = from_le_bytes(section[4 * k :], "<u4", "cpu").long()
        if k and (indices[-1] >= spec.numel or (indices.diff() <= 0).any()):
            raise PayloadError(f"Top-k indices of {spec.name!r} must increase strictly and stay below {spec.numel}.")
        out = torch.zeros(spec.numel, device=device)
        out[indices.to(device)] = values
        return out
