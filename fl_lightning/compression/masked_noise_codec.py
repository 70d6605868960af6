r"""FedMRN's masked random noise (Li et al., "Masked Random Noise for Communication-Efficient
Federated Learning", ACM MM 2024): the functional core and the 1-bit codec.

A client's update is :math:`\hat u = G(s) \odot m` (eq. 8) with noise :math:`n = G(s)` fixed by a
seed and a mask :math:`m \in \{0,1\}^d` (binary) or :math:`\{-1,+1\}^d` (signed), so it uploads the
seed and one bit per element. Noise is always generated on the CPU from a dedicated generator
and then moved, so client and server regenerate it bit for bit on any device.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import torch
from torch import Tensor

from fl_lightning.compression.codec import Codec
from fl_lightning.compression.wire import PREFIX, Layout, PayloadError, TensorSpec, decode_bits, encode_bits
from fl_lightning.server.model_state import State
from fl_lightning.utils.checks import positive

MaskType = Literal["binary", "signed"]
NoiseType = Literal["uniform", "gaussian", "bernoulli"]

MASK_TYPES: tuple[MaskType, ...] = ("binary", "signed")
NOISE_TYPES: tuple[NoiseType, ...] = ("uniform", "gaussian", "bernoulli")
#: The paper's noise magnitudes: binary masks need about twice the signed masks' (§3.1).
DEFAULT_ALPHA: dict[str, float] = {"binary": 1e-2, "signed": 5e-3}
#: Noise smaller than this in magnitude is replaced by it, so ``u / n`` is finite (as the authors' code).
NOISE_EPS = 1e-8


def check_mask_type(mask: str) -> MaskType:
    if mask not in MASK_TYPES:
        raise ValueError(f"`mask` must be one of {MASK_TYPES}, got {mask!r}.")
    return mask  # type: ignore[return-value]


def generate_noise(seed: int, shapes: Sequence[Sequence[int]], *, noise: NoiseType, alpha: float) -> list[Tensor]:
    r"""The round's noise :math:`G(s)`: one ``float32`` CPU tensor per shape, from one generator, in order.

    ``uniform``: :math:`U[-\alpha, \alpha]`; ``gaussian``: :math:`N(0, \alpha^2)`; ``bernoulli``:
    :math:`\pm\alpha` with probability 1/2 each (paper Fig. 5).

    >>> [n.shape for n in generate_noise(0, [(2, 3), (4,)], noise="uniform", alpha=0.01)]
    [torch.Size([2, 3]), torch.Size([4])]
    """
    if noise not in NOISE_TYPES:
        raise ValueError(f"`noise` must be one of {NOISE_TYPES}, got {noise!r}.")
    positive("alpha", alpha)  # the noise magnitude
    generator = torch.Generator().manual_seed(int(seed))
    out = []
    for shape in shapes:
        if noise == "uniform":
            n = torch.rand(tuple(shape), generator=generator).mul_(2).sub_(1)
        elif noise == "gaussian":
            n = torch.randn(tuple(shape), generator=generator)
        else:
            n = torch.randint(0, 2, tuple(shape), generator=generator).float().mul_(2).sub_(1)
        n.mul_(alpha)
        out.append(torch.where(n.abs() < NOISE_EPS, torch.full_like(n, NOISE_EPS), n))
    return out


def mask_probability(u: Tensor, n: Tensor, mask: MaskType) -> Tensor:
    r"""Probability of bit 1: :math:`\mathrm{clip}(u/n, 0, 1)` (eq. 6) or :math:`\mathrm{clip}((u+n)/2n, 0, 1)` (eq. 7)."""
    ratio = u.float() / n.float()
    return (ratio if mask == "binary" else (ratio + 1) / 2).clamp_(0, 1)


def sample_mask(u: Tensor, n: Tensor, mask: MaskType, generator: torch.Generator | None = None) -> Tensor:
    """Stochastic masking :math:`\\mathcal{M}(u, n)` (eq. 6/7) as bits (True = 1, or +1 when signed)."""
    draw = torch.rand(u.shape, generator=generator, device=u.device)
    return draw < mask_probability(u, n, mask)


def deterministic_mask(u: Tensor, n: Tensor) -> Tensor:
    r"""The ablation's deterministic masking :math:`\mathbb{1}[u \cdot n > 0]` (§5.3; the signed rule is
    the paper-silent analogue: +1 where ``u`` and ``n`` agree in sign, else -1)."""
    return (u * n) > 0


def masked_noise(bits: Tensor, n: Tensor, mask: MaskType) -> Tensor:
    r""":math:`n \odot m` (eq. 8) with :math:`m` = bits (binary) or :math:`2\,\mathrm{bits} - 1` (signed); exact in floating point."""
    return torch.where(bits, n, torch.zeros_like(n) if mask == "binary" else -n)


def clip_update(u: Tensor, n: Tensor, mask: MaskType) -> Tensor:
    r"""The continuous update :math:`\bar u` of eq. 10: ``u`` clipped to :math:`[0, n]` (binary) or :math:`[-|n|, |n|]` (signed)."""
    ratio = u / n
    return n * (ratio.clamp(0, 1) if mask == "binary" else ratio.clamp(-1, 1))


def straight_through(x: Tensor, value: Tensor) -> Tensor:
    """``value`` (cast to ``x``'s dtype) in the forward pass, with the gradient passed to ``x`` unchanged (STE, eq. 9).

    Written as ``value + (x - x.detach())``: the added term is exactly 0 for a finite ``x``, so the forward value is
    ``value`` (a negative zero becomes a positive one) and the gradient with respect to ``x`` is the incoming one,
    unchanged. Plain tensor arithmetic: under ``torch.vmap`` (the batched executor's clients) an ``autograd.Function``
    with a generated batching rule cost about 2 ms per call on a CPU, this a few microseconds."""
    return value.to(x.dtype) + (x - x.detach())


def psm_draws(
    u: Tensor, *, p: float, stochastic: bool = True, generator: torch.Generator | None = None
) -> tuple[Tensor | None, Tensor | None]:
    r"""The random numbers one PSM step (eq. 10) draws for ``u`` from ``generator``, in this order: the stochastic
    masking's uniforms (eq. 6/7; ``None`` with ``stochastic=False``), then :math:`P \sim \mathrm{Bern}(p)` as booleans
    (``None`` when ``p >= 1``: every element is masked). They depend on ``u``'s shape only, not on its values."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"Masking probability `p` must be in [0, 1], got {p}.")
    draw = torch.rand(u.shape, generator=generator, device=u.device) if stochastic else None
    chosen = torch.rand(u.shape, generator=generator, device=u.device) < p if p < 1.0 else None
    return draw, chosen


@torch.no_grad()
def psm_value(u: Tensor, n: Tensor, draw: Tensor | None, chosen: Tensor | None, mask: MaskType) -> Tensor:
    r"""The forward value of PSM (eq. 10), :math:`(1 - P) \odot \bar u + P \odot n \odot \mathcal{M}(u, n)`, from the
    step's draws (:func:`psm_draws`; ``draw=None``: deterministic masking, ``chosen=None``: :math:`P \equiv 1`).
    Elementwise, so it takes one client's tensors or several clients' stacked along a leading dimension alike."""
    latent = u.detach()
    bits = draw < mask_probability(latent, n, mask) if draw is not None else deterministic_mask(latent, n)
    value = masked_noise(bits, n, mask)
    return value if chosen is None else torch.where(chosen, value, clip_update(latent.to(n.dtype), n, mask))


def progressive_stochastic_mask(
    u: Tensor,
    n: Tensor,
    *,
    p: float,
    mask: MaskType,
    stochastic: bool = True,
    generator: torch.Generator | None = None,
) -> Tensor:
    r"""PSM (eq. 10): :math:`\hat u = (1 - P) \odot \bar u + P \odot \mathcal{S}(u, n)`, :math:`P \sim \mathrm{Bern}(p)`.

    The forward value is exact (bits times noise, or the clipped update); the gradient reaches
    ``u`` unchanged (straight-through, eq. 9). Draws from ``generator``: the mask first, then
    :math:`P` (skipped when ``p >= 1``). ``stochastic=False`` uses :func:`deterministic_mask`.
    """
    draw, chosen = psm_draws(u, p=p, stochastic=stochastic, generator=generator)
    return straight_through(u, psm_value(u, n, draw, chosen, mask))


class MaskedNoiseCodec(Codec):
    r"""FedMRN's upload: seed, one bit per masked element, full-precision rest.

    Payload: 4-byte prefix, header fields ``mask type (u8), noise type (u8), seed (u64),
    alpha (f32)`` (18 bytes in all), then :math:`\lceil d_i/8 \rceil` bytes per masked tensor and
    4 bytes per element of every other tensor. Decoding regenerates :math:`n = G(s)` on the CPU
    (see :func:`generate_noise`), moves it to ``device`` and returns :math:`n \odot m` (eq. 8),
    bitwise equal to the client's. Header fields must match this codec's configuration.

    Args:
        mask: ``"binary"`` ({0, 1}, FedMRN) or ``"signed"`` ({-1, +1}, FedMRNS).
        noise: ``"uniform"`` (default), ``"gaussian"`` or ``"bernoulli"``.
        alpha: noise magnitude; default 1e-2 (binary) or 5e-3 (signed), as in the paper.
    """

    codec_id = 1
    header_fields = struct.Struct("<BBQf")

    def __init__(self, *, mask: MaskType = "binary", noise: NoiseType = "uniform", alpha: float | None = None) -> None:
        self.mask = check_mask_type(mask)
        if noise not in NOISE_TYPES:
            raise ValueError(f"`noise` must be one of {NOISE_TYPES}, got {noise!r}.")
        self.noise_type: NoiseType = noise
        self.alpha = DEFAULT_ALPHA[mask] if alpha is None else positive("alpha", alpha)  # the noise magnitude
        # The header stores alpha as float32; compare in that precision.
        self._alpha32 = struct.unpack("<f", struct.pack("<f", self.alpha))[0]

    def section_size(self, spec: TensorSpec) -> int:
        return (spec.numel + 7) // 8

    def noise(self, seed: int, layout: Layout, *, device: torch.device | str = "cpu") -> State:
        """:math:`G(s)` for every masked tensor, generated on the CPU and moved to ``device``."""
        tensors = generate_noise(seed, [s.shape for s in layout.compressed], noise=self.noise_type, alpha=self.alpha)
        return {s.name: n.to(device) for s, n in zip(layout.compressed, tensors)}

    def encode(self, seed: int, bits: Mapping[str, Tensor], dense: Mapping[str, Tensor], layout: Layout) -> bytes:
        """Payload of the final masks ``bits`` (boolean, by name), the ``seed`` and the ``dense`` deltas."""
        if not 0 <= seed < 2**64:
            raise ValueError(f"`seed` must fit in 64 bits, got {seed}.")
        sections = [encode_bits(bits[spec.name], spec) for spec in layout.compressed]
        fields = (MASK_TYPES.index(self.mask), NOISE_TYPES.index(self.noise_type), seed, self.alpha)
        return self.pack(fields, sections, dense, layout)

    def decode_sections(
        self, fields: tuple[Any, ...], sections: Sequence[bytes], specs: Sequence[TensorSpec], device: torch.device | str
    ) -> State:
        mask_id, noise_id, seed, alpha = fields
        expected = (MASK_TYPES.index(self.mask), NOISE_TYPES.index(self.noise_type), self._alpha32)
        if (mask_id, noise_id, alpha) != expected:
            raise PayloadError(
                f"Payload header (mask id {mask_id}, noise id {noise_id}, alpha {alpha}) does not match this codec "
                f"(mask {self.mask!r}, noise {self.noise_type!r}, alpha {self.alpha})."
            )
        noise = self.noise(seed, Layout(tuple(specs), ()), device=device)
        return {
            spec.name: masked_noise(decode_bits(section, spec, device), noise[spec.name], self.mask)
            for spec, section in zip(specs, sections)
        }

    @staticmethod
    def seed_of(payload: bytes) -> int:
        """The seed field of a FedMRN payload (for logging and tests)."""
        return int(MaskedNoiseCodec.header_fields.unpack_from(payload, PREFIX.size)[2])
