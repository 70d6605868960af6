r"""FedPM's probability masks (Isik et al., "Sparse Random Networks for Communication-Efficient
Federated Learning", ICLR 2023): the functional core and the 1-bit codec.

Weights :math:`w` are frozen at a seeded random initialisation; what is learnt is a score
:math:`s` per weight, with mask probability :math:`\theta = \mathrm{sigmoid}(s)` and a mask
:math:`m \sim \mathrm{Bern}(\theta)` sampled in every forward pass (effective weight
:math:`w \odot m`). A client uploads one sampled mask, one bit per weight; the server's new
:math:`\theta` is the average of the received masks (formulas as quoted by Li et al. 2024, §2.2).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from fl_lightning.compression.codec import Codec
from fl_lightning.compression.masked_noise_codec import straight_through
from fl_lightning.compression.wire import Layout, TensorSpec, decode_bits, encode_bits
from fl_lightning.server.model_state import State

#: The FedPM authors' clamp of the aggregated probabilities before ``logit``.
DEFAULT_EPS = 0.01


def bernoulli_mask(theta: Tensor, generator: torch.Generator | None = None) -> Tensor:
    r""":math:`m \sim \mathrm{Bern}(\theta)` elementwise, as booleans (one uniform draw per element).

    >>> bernoulli_mask(torch.tensor([0.0, 1.0])).tolist()
    [False, True]
    """
    return torch.rand(theta.shape, generator=generator, device=theta.device) < theta


def sample_probability_mask(scores: Tensor, generator: torch.Generator | None = None) -> Tensor:
    r"""The training-time mask :math:`m \sim \mathrm{Bern}(\mathrm{sigmoid}(s))` as ``0/1`` floats.

    Straight-through: the backward pass treats :math:`m` as :math:`\theta = \mathrm{sigmoid}(s)`, so
    :math:`\partial L / \partial s = \partial L / \partial m \cdot \theta (1 - \theta)` (Zhou et al.
    2019, as used by FedPM; Li et al. 2024 §2.2: :math:`m = \mathrm{Bern}(\mathrm{sigmoid}(s))`).
    """
    theta = torch.sigmoid(scores)
    return straight_through(theta, bernoulli_mask(theta.detach(), generator).to(theta.dtype))


def scores_from_probabilities(theta: Tensor, eps: float = DEFAULT_EPS) -> Tensor:
    r"""A client's initial scores :math:`s = \mathrm{sigmoid}^{-1}(\mathrm{clip}(\theta, \epsilon, 1 - \epsilon))`
    (Li et al. 2024 §2.2, :math:`s^{t+1} = \mathrm{sigmoid}^{-1}[\ldots]`; the clip keeps :math:`s` finite).

    >>> scores_from_probabilities(torch.tensor([0.5, 0.0])).tolist()  # doctest: +ELLIPSIS
    [0.0, -4.59...]
    """
    check_eps(eps)
    return torch.logit(theta.float().clamp(eps, 1 - eps))


def check_eps(eps: float) -> float:
    if not 0.0 < eps < 0.5:
        raise ValueError(f"`eps` must be in (0, 0.5), got {eps}.")
    return eps


def signed_constant_(weight: Tensor, generator: torch.Generator) -> Tensor:
    r"""Fills ``weight`` in place with :math:`\pm e / \sqrt{\mathrm{fan\_in}}`, signs uniform.

    The FedPM authors' initialisation of the frozen weights (their ``ME_init``); ``fan_in`` is the
    number of elements per output unit (``weight[0].numel()``: inputs of a Linear, input channels
    times kernel size of a convolution). Drawn on the CPU from ``generator`` and then copied, so the
    weights are the same on every device.
    """
    scale = math.e / math.sqrt(max(weight[0].numel(), 1))
    signs = torch.randint(0, 2, tuple(weight.shape), generator=generator).mul_(2).sub_(1)
    with torch.no_grad():
        return weight.copy_(signs.to(torch.float32).mul_(scale))


class ProbabilityMaskCodec(Codec):
    r"""FedPM's upload: one sampled mask bit per masked weight, full-precision rest.

    Payload: the 4-byte prefix (no header fields), then :math:`\lceil d_i/8 \rceil` bytes per
    masked tensor (bit 1 = keep the weight) and 4 bytes per element of every other tensor. The
    compressed tensors of the layout are the mask probabilities :math:`\theta`; decoding returns
    each mask as ``0/1`` floats (not a delta), which the server averages into the new :math:`\theta`.
    """

    codec_id = 5

    def section_size(self, spec: TensorSpec) -> int:
        return (spec.numel + 7) // 8

    def encode(self, bits: Mapping[str, Tensor], dense: Mapping[str, Tensor], layout: Layout) -> bytes:
        """Payload of the sampled masks ``bits`` (boolean, by compressed name) and the ``dense`` deltas."""
        sections = [encode_bits(bits[spec.name], spec) for spec in layout.compressed]
        return self.pack((), sections, dense, layout)

    def decode_sections(
        self,
        fields: tuple[Any, ...],
        sections: Sequence[bytes],
        specs: Sequence[TensorSpec],
        device: torch.device | str,
    ) -> State:
        return {s.name: decode_bits(b, s, device).float() for s, b in zip(specs, sections)}
