"""FedMRN's functional core (eq. 6-10) and its 1-bit codec (notes §5.4-5.5)."""

from __future__ import annotations

import math

import pytest
import torch

from fl_lightning.compression import (
    Layout,
    MaskedNoiseCodec,
    PayloadError,
    clip_update,
    deterministic_mask,
    generate_noise,
    mask_probability,
    masked_noise,
    progressive_stochastic_mask,
    sample_mask,
)
from fl_lightning.compression.wire import PREFIX
from fl_lightning.models.masked_networks import CNN4, CNN8

ALPHA = 0.01


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# --- noise G(s) -------------------------------------------------------------------------------


def test_noise_is_a_function_of_the_seed_only():
    shapes = [(3, 4), (5,)]
    first = generate_noise(7, shapes, noise="uniform", alpha=ALPHA)
    torch.manual_seed(123)  # the global RNG must not matter
    torch.rand(10)
    second = generate_noise(7, shapes, noise="uniform", alpha=ALPHA)
    assert all(torch.equal(a, b) for a, b in zip(first, second))
    assert not torch.equal(first[0], generate_noise(8, shapes, noise="uniform", alpha=ALPHA)[0])


def test_noise_golden_values():
    # Catches a change of torch's CPU generator stream, which would break old payloads.
    expected = {
        "uniform": [-7.486819959012792e-05, 0.005364435724914074, -0.008230451494455338, -0.0073593901470303535],
        "gaussian": [0.01540996041148901, -0.0029342889320105314, -0.021787893027067184, 0.005684312433004379],
        "bernoulli": [-0.01, 0.01, 0.01, -0.01],
    }
    for kind, values in expected.items():
        assert generate_noise(0, [(4,)], noise=kind, alpha=ALPHA)[0].tolist() == pytest.approx(values, rel=1e-6)


def test_noise_ranges_and_zero_protection():
    (uniform,) = generate_noise(1, [(10_000,)], noise="uniform", alpha=ALPHA)
    assert uniform.abs().max() <= ALPHA and uniform.abs().min() >= 1e-8
    (bern,) = generate_noise(1, [(1000,)], noise="bernoulli", alpha=ALPHA)
    assert set(bern.unique().tolist()) == pytest.approx([-ALPHA, ALPHA])
    (gauss,) = generate_noise(1, [(10_000,)], noise="gaussian", alpha=ALPHA)
    assert gauss.std().item() == pytest.approx(ALPHA, rel=0.05)
    with pytest.raises(ValueError, match="`noise` must be one of .* got 'laplace'"):
        generate_noise(0, [(2,)], noise="laplace", alpha=ALPHA)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="`alpha` must be a finite number > 0, got 0"):
        generate_noise(0, [(2,)], noise="uniform", alpha=0)


# --- stochastic masking (eq. 6-8) ---------------------------------------------------------------


def test_saturation_and_zero_start():
    n = torch.tensor([0.01, 0.01, -0.01, -0.01, 0.01])
    u = torch.tensor([0.02, -0.005, -0.03, 0.004, 0.0])  # u/n = 2, -0.5, 3, -0.4, 0
    assert mask_probability(u, n, "binary").tolist() == [1.0, 0.0, 1.0, 0.0, 0.0]
    for seed in range(20):
        bits = sample_mask(u, n, "binary", gen(seed))
        assert bits.tolist() == [True, False, True, False, False]
    signed = torch.tensor([0.02, -0.02, 0.0])
    assert mask_probability(signed, torch.full((3,), 0.01), "signed").tolist() == [1.0, 0.0, 0.5]
    assert torch.isfinite(mask_probability(u, torch.full_like(u, 1e-8), "binary")).all()


def test_binary_and_signed_identity():
    n = generate_noise(0, [(100,)], noise="uniform", alpha=ALPHA)[0]
    bits = torch.rand(100, generator=gen()) < 0.5
    assert torch.equal(masked_noise(bits, n, "signed"), 2 * masked_noise(bits, n, "binary") - n)


def test_clip_update_ranges():
    n = torch.tensor([0.01, 0.01, 0.01, -0.01, -0.01])
    u = torch.tensor([0.005, 0.02, -0.01, -0.02, 0.003])
    assert torch.allclose(clip_update(u, n, "binary"), torch.tensor([0.005, 0.01, 0.0, -0.01, 0.0]))
    u2 = torch.tensor([0.005, 0.02, -0.02, 0.02, -0.004])
    assert torch.allclose(clip_update(u2, n, "signed"), torch.tensor([0.005, 0.01, -0.01, 0.01, -0.004]))


@pytest.mark.parametrize("mask", ["binary", "signed"])
def test_stochastic_masking_is_unbiased(mask):
    # Fixed u and n with u/n inside the clip range; mean of n * M(u, n) over many draws -> u.
    n = generate_noise(3, [(200,)], noise="uniform", alpha=ALPHA)[0]
    ratio = torch.rand(200, generator=gen(4)) * (1 if mask == "binary" else 2) - (0 if mask == "binary" else 1)
    u = ratio * n
    draws = 20_000
    u_all, n_all = u.expand(draws, 200), n.expand(draws, 200)
    mean = masked_noise(sample_mask(u_all, n_all, mask, gen(5)), n_all, mask).double().mean(dim=0)
    p = mask_probability(u, n, mask).double()
    std = n.double().abs() * (p * (1 - p)).sqrt() * (1 if mask == "binary" else 2) / math.sqrt(draws)
    z = ((mean - u.double()) / std.clamp_min(1e-12)).abs()
    assert z.max() < 5  # 200 elements, 5 standard errors
    assert z.mean() < 1.0  # E|Z| = 0.8 for a standard normal


def test_deterministic_masking_is_the_sign_agreement():
    u = torch.tensor([0.1, -0.1, 0.1, 0.0])
    n = torch.tensor([0.01, 0.01, -0.01, 0.01])
    assert deterministic_mask(u, n).tolist() == [True, False, False, False]


# --- progressive stochastic masking (eq. 9-10) ------------------------------------------------


@pytest.mark.parametrize("mask", ["binary", "signed"])
def test_psm_last_step_is_pure_masked_noise(mask):
    n = generate_noise(0, [(1000,)], noise="uniform", alpha=ALPHA)[0]
    u = torch.randn(1000, generator=gen(1)) * ALPHA
    out = progressive_stochastic_mask(u, n, p=1.0, mask=mask, generator=gen(2))
    expected = masked_noise(sample_mask(u, n, mask, gen(2)), n, mask)
    assert torch.equal(out, expected)


@pytest.mark.parametrize(("tau", "steps"), [(1, 10), (3, 10), (7, 10)])
def test_psm_masked_fraction_is_tau_over_s(tau, steps):
    # With u strictly inside (0, n) the clipped branch equals u and the masked branch is 0 or n,
    # so an element took the masked branch iff its value differs from u.
    n = torch.full((50_000,), ALPHA)
    u = torch.full((50_000,), ALPHA / 2)
    out = progressive_stochastic_mask(u, n, p=tau / steps, mask="binary", generator=gen(tau))
    fraction = (out != u).double().mean().item()
    assert fraction == pytest.approx(tau / steps, abs=4 * math.sqrt(0.25 / 50_000))


def test_psm_p_zero_is_the_deterministic_clip():
    n = generate_noise(0, [(100,)], noise="uniform", alpha=ALPHA)[0]
    u = torch.randn(100, generator=gen(1)) * ALPHA
    out = progressive_stochastic_mask(u, n, p=0.0, mask="signed", generator=gen(9))
    assert torch.equal(out, clip_update(u, n, "signed"))
    with pytest.raises(ValueError, match="`p` must be in \\[0, 1\\], got 1.5"):
        progressive_stochastic_mask(u, n, p=1.5, mask="binary")


@pytest.mark.parametrize("p", [0.0, 0.4, 1.0])
def test_psm_gradient_is_straight_through(p):
    # dL/du equals dL/dW_eff of a plain Linear layer given the same effective weight (STE, eq. 9).
    torch.manual_seed(0)
    w = torch.randn(3, 5)
    n = generate_noise(0, [(3, 5)], noise="uniform", alpha=ALPHA)[0]
    u = (torch.randn(3, 5) * ALPHA).requires_grad_()
    x, target = torch.randn(8, 5), torch.randn(8, 3)
    update = progressive_stochastic_mask(u, n, p=p, mask="binary", generator=gen(3))
    ((torch.nn.functional.linear(x, w + update) - target) ** 2).sum().backward()
    w_eff = (w + update.detach()).requires_grad_()
    ((torch.nn.functional.linear(x, w_eff) - target) ** 2).sum().backward()
    assert torch.equal(u.grad, w_eff.grad)


# --- codec ---------------------------------------------------------------------------------------


def test_cnn4_svhn_mask_part_is_49772_bytes():
    model = CNN4(in_channels=3, image_size=32)
    model.install_masked_noise()
    state = model.state_dict()
    layout = Layout.from_state(state, model.masked_parameter_names)
    codec = MaskedNoiseCodec()
    d = sum(s.numel for s in layout.compressed)
    mask_bytes = sum(codec.section_size(s) for s in layout.compressed)
    assert d == 398_176 and mask_bytes == 49_772
    dense = sum(t.numel() for n, t in state.items() if n not in codec_names(layout))
    assert dense == 960 + 960 + 4  # BN affine, running stats, 4 counters
    assert codec.payload_size(layout) == codec.header_size + 49_772 + 4 * dense
    assert codec.header_size == 18


def codec_names(layout):
    return {s.name for s in layout.compressed}


@pytest.mark.parametrize(
    ("model", "d"),
    [(lambda: CNN4(), 389_920), (lambda: CNN8(), 1_181_536), (lambda: CNN8(num_classes=100), 1_273_696)],
    ids=["cnn4-fmnist", "cnn8-cifar10", "cnn8-cifar100"],
)
def test_paper_model_sizes(model, d):
    m = model()
    m.install_masked_noise()
    assert sum(p.numel() for n, p in m.named_parameters() if n in m.masked_parameter_names) == d


def small_layout():
    state = {"a.weight": torch.randn(3, 5), "a.bias": torch.randn(3), "b.weight": torch.randn(2, 3), "bn.n": torch.tensor(4)}
    return state, Layout.from_state(state, ["a.weight", "b.weight"])


@pytest.mark.parametrize("mask", ["binary", "signed"])
@pytest.mark.parametrize("noise", ["uniform", "gaussian", "bernoulli"])
def test_codec_reconstruction_is_bit_exact(mask, noise):
    state, layout = small_layout()
    codec = MaskedNoiseCodec(mask=mask, noise=noise)
    seed = 2**63 + 12345  # the full 64-bit seed range travels
    client_noise = codec.noise(seed, layout)
    bits = {s.name: torch.rand(s.shape, generator=gen(len(s.name))) < 0.5 for s in layout.compressed}
    payload = codec.encode(seed, bits, state, layout)
    assert len(payload) == codec.payload_size(layout) == 18 + 2 + 1 + 4 * (3 + 1)
    assert MaskedNoiseCodec.seed_of(payload) == seed
    decoded = codec.decode(payload, layout)
    for name, b in bits.items():
        assert torch.equal(decoded[name], masked_noise(b, client_noise[name], mask))
    assert torch.equal(decoded["a.bias"], state["a.bias"]) and decoded["bn.n"].item() == 4


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_codec_reconstruction_on_gpu_matches_cpu():
    state, layout = small_layout()
    codec = MaskedNoiseCodec()
    bits = {s.name: torch.rand(s.shape, generator=gen()) < 0.5 for s in layout.compressed}
    payload = codec.encode(5, bits, state, layout)
    cpu, cuda = codec.decode(payload, layout), codec.decode(payload, layout, device="cuda")
    assert all(torch.equal(cpu[k], cuda[k].cpu()) for k in cpu)


def test_codec_rejects_mismatched_configuration():
    state, layout = small_layout()
    bits = {s.name: torch.ones(s.shape, dtype=torch.bool) for s in layout.compressed}
    payload = MaskedNoiseCodec(mask="signed").encode(1, bits, state, layout)
    with pytest.raises(PayloadError, match="does not match this codec"):
        MaskedNoiseCodec(mask="binary").decode(payload, layout)
    with pytest.raises(PayloadError, match="does not match this codec"):
        MaskedNoiseCodec(mask="signed", alpha=0.02).decode(payload, layout)
    with pytest.raises(ValueError, match="must be boolean of shape"):
        MaskedNoiseCodec().encode(1, {**bits, "a.weight": torch.ones(3, 5)}, state, layout)
    with pytest.raises(ValueError, match="`mask` must be one of .* got 'ternary'"):
        MaskedNoiseCodec(mask="ternary")  # type: ignore[arg-type]
    assert PREFIX.size == 4
