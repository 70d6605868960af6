"""FedPM's functional core (Bernoulli masks, straight-through scores) and its 1-bit codec."""

from __future__ import annotations

import math

import pytest
import torch

from fl_lightning.compression import (
    Layout,
    MaskedNoiseCodec,
    PayloadError,
    ProbabilityMaskCodec,
    bernoulli_mask,
    sample_probability_mask,
    scores_from_probabilities,
    signed_constant_,
)


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_mask_mean_is_sigmoid_of_the_score():
    scores = torch.tensor([-3.0, -1.0, 0.0, 0.5, 2.0])
    draws = 20_000
    masks = sample_probability_mask(scores.expand(draws, -1).contiguous(), gen(0))
    theta = torch.sigmoid(scores)
    assert set(masks.unique().tolist()) <= {0.0, 1.0}
    # Bernoulli: the mean of n draws has std sqrt(θ(1-θ)/n); allow 5 std.
    tolerance = 5 * torch.sqrt(theta * (1 - theta) / draws)
    assert torch.all((masks.mean(0) - theta).abs() < tolerance)


def test_gradient_passes_straight_through_to_the_scores():
    scores = torch.linspace(-2, 2, 7, requires_grad=True)
    upstream = torch.arange(1.0, 8.0)
    mask = sample_probability_mask(scores, gen(1))
    (mask * upstream).sum().backward()
    theta = torch.sigmoid(scores.detach())
    # ∂L/∂s = ∂L/∂m · θ(1 - θ): the sampling step is the identity backwards.
    torch.testing.assert_close(scores.grad, upstream * theta * (1 - theta))


def test_bernoulli_extremes_and_generator():
    assert bernoulli_mask(torch.tensor([0.0, 1.0, 0.0, 1.0])).tolist() == [False, True, False, True]
    theta = torch.full((100,), 0.3)
    assert torch.equal(bernoulli_mask(theta, gen(4)), bernoulli_mask(theta, gen(4)))


def test_scores_are_clipped_logits():
    theta = torch.tensor([0.0, 0.005, 0.5, 0.9, 1.0])
    scores = scores_from_probabilities(theta, eps=0.01)
    assert torch.isfinite(scores).all()
    expected = torch.logit(torch.tensor([0.01, 0.01, 0.5, 0.9, 0.99]))
    torch.testing.assert_close(scores, expected)
    for eps in (0.0, 0.5, -1.0):
        with pytest.raises(ValueError, match=r"`eps` must be in \(0, 0.5\)"):
            scores_from_probabilities(theta, eps=eps)


def test_signed_constant_init():
    linear, conv = torch.empty(5, 16), torch.empty(4, 3, 3, 3)
    signed_constant_(linear, gen(0))
    signed_constant_(conv, gen(0))
    assert set(linear.abs().unique().tolist()) == pytest.approx([math.e / 4])  # fan_in 16
    assert set(conv.abs().unique().tolist()) == pytest.approx([math.e / math.sqrt(27)])
    assert (linear > 0).any() and (linear < 0).any()
    again = torch.empty(5, 16)
    assert torch.equal(signed_constant_(again, gen(0)), linear)


STATE = {
    "a.theta": torch.zeros(3, 5),
    "b.theta": torch.zeros(9),
    "bn.weight": torch.zeros(4),
    "bn.n": torch.zeros((), dtype=torch.long),
}
LAYOUT = Layout.from_state(STATE, ["a.theta", "b.theta"])


def payload_of(bits: dict[str, torch.Tensor]) -> bytes:
    dense = {"bn.weight": torch.arange(4.0), "bn.n": torch.tensor(3)}
    return ProbabilityMaskCodec().encode(bits, dense, LAYOUT)


def random_bits(seed: int = 0) -> dict[str, torch.Tensor]:
    return {s.name: torch.rand(s.shape, generator=gen(seed)) < 0.5 for s in LAYOUT.compressed}


def test_payload_bytes_are_exact_and_decoding_returns_the_masks():
    bits = random_bits()
    payload = payload_of(bits)
    # 4-byte prefix + ceil(15/8) + ceil(9/8) + 4 bytes per dense element (4 floats + 1 counter).
    assert len(payload) == ProbabilityMaskCodec().payload_size(LAYOUT) == 4 + 2 + 2 + 4 * 5
    decoded = ProbabilityMaskCodec().decode(payload, LAYOUT)
    for name, b in bits.items():
        assert decoded[name].dtype == torch.float32
        assert torch.equal(decoded[name], b.float())
    assert torch.equal(decoded["bn.weight"], torch.arange(4.0)) and decoded["bn.n"].item() == 3


def set_padding_bit(payload: bytes) -> bytes:
    # "b.theta" has 9 elements: its second byte (offset 4 + 2 + 1) holds 1 bit + 7 padding bits.
    data = bytearray(payload)
    data[7] |= 0x80
    return bytes(data)


CORRUPTIONS = {
    "truncated": (lambda p: p[:-1], "needs exactly"),
    "too-long": (lambda p: p + b"\x00", "needs exactly"),
    "bad-magic": (lambda p: b"ZZ" + p[2:], "Bad magic"),
    "unknown-version": (lambda p: p[:2] + b"\x09" + p[3:], "Unknown payload version"),
    "other-codec": (lambda p: p[:3] + bytes([MaskedNoiseCodec.codec_id]) + p[4:], "codec id 1"),
    "padding-bits": (set_padding_bit, "padding bits"),
}


@pytest.mark.parametrize(("corrupt", "match"), CORRUPTIONS.values(), ids=CORRUPTIONS.keys())
def test_malformed_payloads_raise(corrupt, match):
    with pytest.raises(PayloadError, match=match):
        ProbabilityMaskCodec().decode(corrupt(payload_of(random_bits())), LAYOUT)


def test_encode_rejects_non_boolean_or_misshapen_masks():
    bits = random_bits()
    with pytest.raises(ValueError, match="must be boolean of shape"):
        payload_of({**bits, "a.theta": bits["a.theta"].float()})
    with pytest.raises(ValueError, match="must be boolean of shape"):
        payload_of({**bits, "b.theta": bits["b.theta"][:8]})
