"""ProbabilityMaskMixin: θ in the state, scores out of it, frozen weights, w ⊙ m in the forward, STE."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F

from fl_lightning.compression import bernoulli_mask
from fl_lightning.mixins import ProbabilityMaskMixin

from .nets import MASKED, Net, batch

THETA = ["net.0.probability_mask.weight", "net.3.probability_mask.weight"]


class MaskedNet(ProbabilityMaskMixin, Net):
    pass


def make(seed: int = 0) -> MaskedNet:
    torch.manual_seed(seed)
    model = MaskedNet()
    model.install_probability_masks()
    return model


def plain_with_masks(model: MaskedNet, masks: dict[str, torch.Tensor]) -> Net:
    """The plain network whose masked weights are ``w ⊙ m``."""
    plain = Net()
    plain.load_state_dict({k: v for k, v in model.state_dict().items() if k not in THETA})
    with torch.no_grad():
        for name, m in masks.items():
            plain.get_parameter(name).mul_(m.float())
    return plain


def test_state_dict_holds_theta_but_not_the_scores():
    model = make()
    assert model.masked_parameter_names == MASKED
    assert list(model.mask_probability_names.values()) == THETA
    assert set(model.state_dict()) == {*Net().state_dict(), *THETA}
    assert all(torch.equal(model.state_dict()[k], torch.full_like(model.state_dict()[k], 0.5)) for k in THETA)
    parameters = dict(model.named_parameters())
    assert {"net.0.probability_mask.scores.weight", "net.3.probability_mask.scores.weight"} <= parameters.keys()
    assert not any("scores" in k or "uniform" in k for k in model.state_dict())
    assert not any(parameters[n].requires_grad for n in MASKED)  # frozen for good
    other = make(seed=1)
    other.load_state_dict(model.state_dict())  # strict
    assert torch.equal(other.net[0].weight, model.net[0].weight)


def test_evaluation_uses_the_fixed_sample_of_theta():
    model = make()
    with torch.no_grad():
        model.mask_probabilities()["net.0.weight"].fill_(0.3)
    x, _ = batch()
    model.eval()
    masks = {
        name: model.net[int(name.split(".")[1])].probability_mask.get_buffer("weight_uniform") < theta
        for name, theta in model.mask_probabilities().items()
    }
    plain = plain_with_masks(model, masks).eval()
    assert torch.equal(model(x), plain(x))
    assert torch.equal(model(x), model(x))  # deterministic
    assert 0.2 < masks["net.0.weight"].float().mean() < 0.4


def test_round_trains_scores_and_unmasked_tensors_only():
    model = make()
    before = copy.deepcopy(model.state_dict())
    model.begin_probability_mask_round(generator=torch.Generator().manual_seed(0))
    assert all(s.abs().sum() == 0 for s in model.mask_scores().values())  # logit(0.5)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    model.train()
    for step in range(3):
        opt.zero_grad()
        model.training_step(batch(step), step).backward()
        opt.step()
    after = model.state_dict()
    for name in (*MASKED, *THETA):
        assert torch.equal(after[name], before[name]), name  # frozen weights, θ unchanged
    assert all(s.abs().sum() > 0 for s in model.mask_scores().values())
    for name in ("net.0.bias", "net.1.weight", "net.1.running_mean"):
        assert not torch.equal(after[name], before[name]), name
    bits = model.end_probability_mask_round(torch.Generator().manual_seed(1))
    assert set(bits) == set(MASKED) and all(b.dtype == torch.bool for b in bits.values())
    with pytest.raises(RuntimeError, match="without begin_probability_mask_round"):
        model.end_probability_mask_round()


def test_training_forward_is_w_times_a_fresh_mask_with_ste_gradients():
    model = make()
    with torch.no_grad():
        for theta in model.mask_probabilities().values():
            theta.uniform_(0.1, 0.9, generator=torch.Generator().manual_seed(5))
    model.begin_probability_mask_round(eps=0.01, generator=torch.Generator().manual_seed(0))
    scores = model.mask_scores()
    for name, s in scores.items():  # s = logit(θ)
        torch.testing.assert_close(torch.sigmoid(s), model.mask_probabilities()[name])
    x, y = batch()
    model.train()
    model.training_step((x, y), 0).backward()
    # Same draws, in forward order: net.0 then net.3.
    g = torch.Generator().manual_seed(0)
    masks = {name: bernoulli_mask(torch.sigmoid(s.detach()), g) for name, s in scores.items()}
    plain = plain_with_masks(model, masks).train()
    F.cross_entropy(plain(x), y).backward()
    for name, s in scores.items():
        weight = model.get_parameter(name)
        theta = torch.sigmoid(s.detach())
        # ∂L/∂s = ∂L/∂(w ⊙ m) · w · θ(1 - θ): straight through the Bernoulli draw.
        expected = plain.get_parameter(name).grad * weight * theta * (1 - theta)
        torch.testing.assert_close(s.grad, expected)
        assert weight.grad is None


def test_reset_random_network_is_seeded():
    first, second = make(seed=0), make(seed=1)
    first.reset_random_network(7)
    second.reset_random_network(7)
    for name in MASKED:
        assert torch.equal(first.get_parameter(name), second.get_parameter(name))
        fan_in = first.get_parameter(name)[0].numel()
        assert first.get_parameter(name).abs().unique().tolist() == pytest.approx([math.e / math.sqrt(fan_in)])

    def uniform(model: MaskedNet) -> list[torch.Tensor]:
        return [model.get_buffer(f"{n.rpartition('.')[0]}.probability_mask.weight_uniform") for n in MASKED]

    assert all(torch.equal(a, b) for a, b in zip(uniform(first), uniform(second)))  # the evaluation draws U too
    second.reset_random_network(8)
    assert not any(torch.equal(a, b) for a, b in zip(uniform(first), uniform(second)))
    kept = make(seed=0)
    weight = kept.net[0].weight.clone()
    kept.reset_random_network(7, weight_init="module")
    assert torch.equal(kept.net[0].weight, weight)
    with pytest.raises(ValueError, match="`weight_init` must be one of"):
        kept.reset_random_network(7, weight_init="zeros")  # type: ignore[arg-type]


def test_custom_maskable_selection():
    class OnlyLast(MaskedNet):
        def maskable_parameter_names(self):
            return ["net.3.weight"]

    model = OnlyLast()
    model.install_probability_masks()
    assert model.mask_probability_names == {"net.3.weight": "net.3.probability_mask.weight"}
    assert model.net[0].weight.requires_grad
