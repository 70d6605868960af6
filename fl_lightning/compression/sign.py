r"""Stochastic sign compression with a scale (SignSGD-style, Safaryan & Richtárik, ICML 2021)."""

from __future__ import annotations

import struct

import torch
from torch import Tensor

from fl_lightning.compression.codec import UpdateCodec
from fl_lightning.compression.masked_noise_codec import masked_noise, sample_mask
from fl_lightning.compression.wire import PayloadError, TensorSpec, pack_bits, unpack_bits

_SCALE = struct.Struct("<f")


class StochasticSignCodec(UpdateCodec):
    r"""Each tensor :math:`x` becomes :math:`s \cdot \mathrm{sign}` with :math:`s = \max_i |x_i|` and
    :math:`+s` drawn with probability :math:`\tfrac12 + x_i / 2s`, so :math:`E[\hat x] = x` (unbiased).

    It is FedMRN's signed stochastic masking (eq. 7) applied after local training with a
    *constant*, data-dependent magnitude :math:`s` in place of seeded noise: the scaled stochastic
    SignSGD baseline of the paper's tables. It is not the paper's "FedAvg w. SM" (§5.4), which masks
    over the seeded random noise :math:`G(s)`: that is :class:`~fl_lightning.algorithms.FedAvgSM`.
    Section: scale (``float32``)
    then :math:`\lceil d/8 \rceil` bytes of signs (bit 1 = +s), 1 bit per element + 32 bits per tensor.
    """

    codec_id = 2

    def section_size(self, spec: TensorSpec) -> int:
        return _SCALE.size + (spec.numel + 7) // 8

    def encode_tensor(self, x: Tensor, generator: torch.Generator | None) -> bytes:
        scale = float(x.abs().max()) if x.numel() else 0.0
        noise = torch.full_like(x, max(scale, torch.finfo(torch.float32).tiny))
        bits = sample_mask(x, noise, "signed", generator)
        return _SCALE.pack(scale) + pack_bits(bits).cpu().numpy().tobytes()

    def decode_tensor(self, section: bytes, spec: TensorSpec, device: torch.device | str) -> Tensor:
        (scale,) = _SCALE.unpack_from(section)
        if not scale >= 0:
            raise PayloadError(f"Sign scale of {spec.name!r} must be >= 0, got {scale}.")
        bits = unpack_bits(torch.frombuffer(bytearray(section[_SCALE.size :]), dtype=torch.uint8).to(device), spec.numel)
        return masked_noise(bits, torch.full(bits.shape, scale, device=device), "signed")
