"""Fixed-point encoding and pairwise additive masks (Bonawitz et al. 2017, "Practical Secure
Aggregation for Privacy-Preserving Machine Learning", §4, masking with one-time pads).

Values live in :math:`\\mathbb Z_M`, :math:`M = 2^{b}`: a real :math:`x` is encoded as
:math:`\\mathrm{round}(x\\,2^{f}) \\bmod M` and decoded from the signed (two's complement) residue,
so sums of encodings decode to the sum of the rounded values while :math:`|\\sum| < 2^{b-1-f}`;
beyond that the modular sum wraps silently, so a sum of :math:`n` encodings is kept in range by
refusing any value with :math:`n|x| \\ge 2^{b-1-f}` before it is masked.
Clients :math:`u < v` share a seed :math:`s_{uv}` (in the protocol, from a Diffie-Hellman key
agreement; here derived from the run's seed); :math:`u` adds :math:`\\mathrm{PRG}(s_{uv})`, :math:`v`
subtracts it, so the masks cancel exactly in the sum over every client of the round.
"""

from __future__ import annotations

import torch
from torch import Tensor

from fl_lightning.utils.seeding import make_generator


def encode(values: Tensor, modulus_bits: int, fraction_bits: int, summands: int = 1) -> Tensor:
    """``values`` (float) in fixed point, as int64 residues in ``[0, 2**modulus_bits)``, checked so that a sum of
    ``summands`` such encodings cannot wrap: every :math:`|x| \\cdot` ``summands`` :math:`< 2^{b-1-f}`."""
    if not bool(torch.isfinite(values).all()):
        raise ValueError("Fixed point encodes finite values only: NaN would encode to 0 and Inf cannot be encoded.")
    scaled = torch.round(values.double() * 2.0**fraction_bits)
    limit = 2.0 ** (modulus_bits - 1) / summands
    if scaled.abs().max() * summands >= 2.0 ** (modulus_bits - 1):
        raise OverflowError(
            f"A value of magnitude {values.abs().max().item():.4g} summed over {summands} clients does not fit "
            f"{modulus_bits}-bit fixed point with {fraction_bits} fraction bits (each |x| must stay below "
            f"{limit / 2**fraction_bits:.4g}, or the modular sum wraps): raise modulus_bits or lower fraction_bits."
        )
    return scaled.to(torch.int64) % (1 << modulus_bits)


def decode(residues: Tensor, modulus_bits: int, fraction_bits: int) -> Tensor:
    """The float64 values of int64 residues (the signed representative of each)."""
    modulus = 1 << modulus_bits
    signed = torch.where(residues >= modulus // 2, residues - modulus, residues)
    return signed.double() / 2.0**fraction_bits


def pair_mask(seed: int, round_idx: int, u: int, v: int, size: int, modulus_bits: int) -> Tensor:
    """The one-time pad clients ``u`` and ``v`` share in round ``round_idx`` (symmetric in ``u, v``)."""
    generator = make_generator(seed, "secagg", round_idx, min(u, v), max(u, v))
    return torch.randint(0, 1 << modulus_bits, (size,), generator=generator, dtype=torch.int64)


def masked(residues: Tensor, client: int, peers: list[int], seed: int, round_idx: int, modulus_bits: int) -> Tensor:
    """``residues`` plus client ``client``'s pairwise masks with every other of ``peers`` (mod M)."""
    modulus, out = 1 << modulus_bits, residues.clone()
    for peer in peers:
        if peer == client:
            continue
        mask = pair_mask(seed, round_idx, client, peer, len(residues), modulus_bits)
        out = (out + mask if client < peer else out - mask) % modulus
    return out
