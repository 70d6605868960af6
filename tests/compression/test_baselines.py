"""SignSGD / TernGrad / Top-k codecs: exact sizes, reconstruction rules, unbiasedness."""

from __future__ import annotations

import math

import pytest
import torch

from fl_lightning.compression import Layout, PayloadError, StochasticSignCodec, TernGradCodec, TopKCodec
from fl_lightning.compression.wire import PREFIX


def make_state():
    g = torch.Generator().manual_seed(0)
    return {"conv": torch.randn(4, 3, 3, 3, generator=g), "bias": torch.randn(4, generator=g), "fc": torch.randn(10, 7, generator=g)}


def layout_of(state):
    return Layout.from_state(state, ["conv", "fc"])


@pytest.mark.parametrize(
    ("codec", "section"),
    [
        (StochasticSignCodec(), lambda d: 4 + math.ceil(d / 8)),
        (TernGradCodec(), lambda d: 4 + math.ceil(d / 5)),
        (TopKCodec(density=0.1), lambda d: 8 * math.ceil(0.1 * d)),
    ],
    ids=["sign", "terngrad", "topk"],
)
def test_payload_size_formula(codec, section):
    state = make_state()
    layout = layout_of(state)
    payload = codec.encode(state, layout, generator=torch.Generator().manual_seed(1))
    expected = PREFIX.size + section(108) + section(70) + 4 * 4
    assert len(payload) == codec.payload_size(layout) == expected
    out = codec.decode(payload, layout)
    assert torch.equal(out["bias"], state["bias"])  # full precision passes through exactly
    assert out.keys() == state.keys() and all(out[k].shape == state[k].shape for k in state)


def test_sign_values_are_plus_minus_scale():
    state = make_state()
    out = StochasticSignCodec().decode(StochasticSignCodec().encode(state, layout_of(state)), layout_of(state))
    scale = state["fc"].abs().max()
    assert set(out["fc"].abs().unique().tolist()) == {scale.item()}
    # The largest-magnitude entry is saturated: its sign is deterministic.
    i = state["fc"].abs().argmax()
    assert out["fc"].flatten()[i] == state["fc"].flatten()[i]


def test_terngrad_values_and_signs():
    state = make_state()
    codec = TernGradCodec()
    out = codec.decode(codec.encode(state, layout_of(state), generator=torch.Generator().manual_seed(2)), layout_of(state))
    scale = state["conv"].abs().max().item()
    assert set(out["conv"].unique().tolist()) <= {-scale, 0.0, scale}
    nonzero = out["conv"] != 0
    assert torch.equal(torch.sign(out["conv"][nonzero]), torch.sign(state["conv"][nonzero]))


def test_topk_keeps_largest_entries_exactly():
    state = make_state()
    codec = TopKCodec(density=0.1)
    out = codec.decode(codec.encode(state, layout_of(state)), layout_of(state))
    k = codec.k(70)
    kept = out["fc"].flatten() != 0
    assert kept.sum() == k
    assert torch.equal(out["fc"].flatten()[kept], state["fc"].flatten()[kept])
    assert state["fc"].abs().flatten()[kept].min() >= state["fc"].abs().flatten()[~kept].max()


@pytest.mark.parametrize("codec", [StochasticSignCodec(), TernGradCodec()], ids=["sign", "terngrad"])
def test_stochastic_codecs_are_unbiased(codec):
    # 4000 copies of x in one tensor share the scale max|x| = 1: each copy is an independent draw.
    trials, x = 4000, torch.linspace(-1, 1, 50)
    state = {"w": x.repeat(trials)}
    layout = Layout.from_state(state, ["w"])
    decoded = codec.decode(codec.encode(state, layout, generator=torch.Generator().manual_seed(3)), layout)["w"]
    # Per-element std of one draw is <= max|x| = 1, so the mean's is <= 1/sqrt(trials) ~ 0.016.
    assert (decoded.view(trials, 50).mean(dim=0) - x).abs().max() < 5 / math.sqrt(trials)


def test_invalid_sections_raise():
    state = {"w": torch.randn(12)}
    layout = Layout.from_state(state, ["w"])
    topk = TopKCodec(density=0.25)
    payload = bytearray(topk.encode(state, layout))
    payload[-4:] = (99).to_bytes(4, "little")  # last index out of range
    with pytest.raises(PayloadError, match="indices of 'w'"):
        topk.decode(bytes(payload), layout)
    tern = TernGradCodec()
    payload = bytearray(tern.encode(state, layout, generator=torch.Generator().manual_seed(0)))
    payload[-1] = 250
    with pytest.raises(PayloadError, match="byte >= 243"):
        tern.decode(bytes(payload), layout)
    with pytest.raises(ValueError, match="`density` must be in \\(0, 1\\], got 0"):
        TopKCodec(density=0)
