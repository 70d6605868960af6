r"""TernGrad (Wen et al., NeurIPS 2017): unbiased ternary updates, packed 5 trits per byte."""

from __future__ import annotations

import struct

import torch
from torch import Tensor

from fl_lightning.compression.codec import UpdateCodec
from fl_lightning.compression.wire import PayloadError, TensorSpec

_SCALE = struct.Struct("<f")
_TRITS_PER_BYTE = 5  # 3**5 = 243 <= 256: 1.6 bits per element, close to log2(3) = 1.58
_POWERS = 3 ** torch.arange(_TRITS_PER_BYTE, dtype=torch.int64)


class TernGradCodec(UpdateCodec):
    r"""Each tensor :math:`x` becomes :math:`s \cdot \mathrm{sign}(x) \odot b` with :math:`s = \max_i |x_i|`
    and :math:`b_i \sim \mathrm{Bern}(|x_i| / s)` (TernGrad eq. 3, per-tensor scale), unbiased.

    Choices: no gradient clipping (TernGrad's optional :math:`2.5\sigma` clip is for SGD
    gradients, not model deltas). Section: scale (``float32``), then trits ``t + 1`` in base 3,
    5 per byte: :math:`4 + \lceil d/5 \rceil` bytes.
    """

    codec_id = 3

    def section_size(self, spec: TensorSpec) -> int:
        return _SCALE.size + -(-spec.numel // _TRITS_PER_BYTE)

    def encode_tensor(self, x: Tensor, generator: torch.Generator | None) -> bytes:
        flat = x.reshape(-1)
        scale = float(flat.abs().max()) if flat.numel() else 0.0
        keep = torch.rand(flat.shape, generator=generator, device=flat.device) < flat.abs() / max(scale, 1e-38)
        digits = (torch.sign(flat) * keep + 1).long()
        digits = torch.nn.functional.pad(digits, (0, (-digits.numel()) % _TRITS_PER_BYTE))
        packed = (digits.view(-1, _TRITS_PER_BYTE) * _POWERS.to(digits.device)).sum(dim=1).to(torch.uint8)
        return _SCALE.pack(scale) + packed.cpu().numpy().tobytes()

    def decode_tensor(self, section: bytes, spec: TensorSpec, device: torch.device | str) -> Tensor:
        (scale,) = _SCALE.unpack_from(section)
        if not scale >= 0:
            raise PayloadError(f"TernGrad scale of {spec.name!r} must be >= 0, got {scale}.")
        packed = torch.frombuffer(bytearray(section[_SCALE.size :]), dtype=torch.uint8).to(device).long()
        if (packed >= 3**_TRITS_PER_BYTE).any():
            raise PayloadError(f"TernGrad section of {spec.name!r} has a byte >= 243 (not 5 base-3 digits).")
        digits = (packed.view(-1, 1) // _POWERS.to(device)) % 3
        digits = digits.reshape(-1)
        if digits[spec.numel :].any():
            raise PayloadError(f"Non-zero padding trits in the TernGrad section of {spec.name!r}.")
        return (digits[: spec.numel] - 1).float() * scale
