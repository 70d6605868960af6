"""MaskedNoiseMixin: u and n stay out of the state, forward sees w + û (eq. 10), STE, PM schedule."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from fl_lightning.compression import generate_noise, masked_noise, sample_mask
from fl_lightning.mixins import MaskedNoiseMixin

from .nets import MASKED, Net, batch

ALPHA = 0.01


class MaskedNet(MaskedNoiseMixin, Net):
    def __init__(self) -> None:
        super().__init__()
        self.probabilities: list[float] = []

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        self.probabilities.append(self.masking_probability)
        return loss


def make(seed: int = 0) -> MaskedNet:
    torch.manual_seed(seed)
    model = MaskedNet()
    model.install_masked_noise()
    return model


def noise_for(model: MaskedNet, seed: int = 1) -> dict[str, torch.Tensor]:
    params = dict(model.named_parameters())
    shapes = [params[n].shape for n in model.masked_parameter_names]
    return dict(zip(model.masked_parameter_names, generate_noise(seed, shapes, noise="uniform", alpha=ALPHA)))


def local_training(model: MaskedNet, steps: int, *, mask="binary", **kwargs) -> torch.optim.Optimizer:
    model.begin_masked_noise_round(
        noise_for(model), total_steps=steps, mask=mask, generator=torch.Generator().manual_seed(2), **kwargs
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    model.train()
    for step in range(steps):
        opt.zero_grad()
        model.training_step(batch(step), step).backward()
        opt.step()
    return opt


def test_default_maskable_tensors_and_state_dict_is_the_plain_models():
    model = make()
    assert model.masked_parameter_names == MASKED
    plain_keys = list(Net().state_dict())
    assert list(model.state_dict()) == plain_keys  # no u, no n, same names
    assert list(model.state_dict(keep_vars=True)) == plain_keys
    names = dict(model.named_parameters())
    assert {"net.0.latent_update.weight", "net.3.latent_update.weight"} <= names.keys()  # optimised via parameters()
    other = make(seed=1)
    other.load_state_dict(model.state_dict())  # strict: no missing u keys
    assert torch.equal(other.net[0].weight, model.net[0].weight)


def test_inactive_mixin_is_the_plain_model():
    model = make()
    plain = Net()
    plain.load_state_dict(model.state_dict())
    x, _ = batch()
    model.eval(), plain.eval()
    assert torch.equal(model(x), plain(x))


def test_first_binary_step_equals_the_global_model():
    # u = 0: the clipped branch is 0 and stochastic masks are all 0, so û = 0 exactly.
    model = make()
    plain = Net()
    plain.load_state_dict(model.state_dict())
    model.begin_masked_noise_round(noise_for(model), total_steps=4, generator=torch.Generator().manual_seed(0))
    model.draw_masked_noise()
    x, _ = batch()
    model.eval(), plain.eval()
    assert torch.equal(model(x), plain(x))


def test_local_training_changes_u_and_unmasked_params_only():
    model = make()
    before = copy.deepcopy(model.state_dict())
    local_training(model, steps=5)
    after = model.state_dict()
    for name in MASKED:
        assert torch.equal(after[name], before[name]), name  # global weights frozen
        assert model.latent_updates()[name].abs().sum() > 0
    for name in ("net.0.bias", "net.1.weight", "net.1.bias", "net.1.running_mean"):
        assert not torch.equal(after[name], before[name]), name  # biases, BN train normally
    bits = model.end_masked_noise_round(torch.Generator().manual_seed(3))
    assert all(model.get_parameter(n).requires_grad for n in MASKED)  # restored after the round
    assert set(bits) == set(MASKED) and all(b.dtype == torch.bool for b in bits.values())


def test_effective_weight_and_ste_gradient():
    model = make()
    noise = noise_for(model)
    model.begin_masked_noise_round(noise, total_steps=1, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():  # a latent update inside (0, n) on every element
        for name, u in model.latent_updates().items():
            u.copy_(noise[name] * 0.5)
    x, y = batch()
    model.train()
    loss = model.training_step((x, y), 0)
    loss.backward()
    # p = 1 at the single step: the forward weight is w + n ⊙ M(u, n) with the same draws.
    g = torch.Generator().manual_seed(0)
    plain = Net()
    plain.load_state_dict(model.state_dict())
    with torch.no_grad():
        for name in MASKED:
            u = model.latent_updates()[name]
            plain.get_parameter(name).add_(masked_noise(sample_mask(u, noise[name], "binary", g), noise[name], "binary"))
    plain.train()
    F.cross_entropy(plain(x), y).backward()
    for name in MASKED:
        assert torch.equal(model.latent_updates()[name].grad, plain.get_parameter(name).grad), name
        assert model.get_parameter(name).grad is None


def test_psm_probability_follows_local_steps():
    model = make()
    local_training(model, steps=4)
    assert model.probabilities == [0.25, 0.5, 0.75, 1.0]
    model.end_masked_noise_round()
    model.probabilities.clear()
    local_training(model, steps=3, progressive=False)
    assert model.probabilities == [1.0, 1.0, 1.0]
    assert model.masking_probability == 1.0
    model.end_masked_noise_round()
    assert model.masking_probability == 0.0


def test_u_is_reset_every_round():
    model = make()
    local_training(model, steps=3)
    model.end_masked_noise_round()
    model.begin_masked_noise_round(noise_for(model), total_steps=2)
    assert all(u.abs().sum() == 0 for u in model.latent_updates().values())


def test_deterministic_final_mask():
    model = make()
    local_training(model, steps=3, stochastic=False)
    u = {k: v.detach().clone() for k, v in model.latent_updates().items()}
    noise = noise_for(model)
    bits = model.end_masked_noise_round()
    assert all(torch.equal(bits[k], u[k] * noise[k] > 0) for k in MASKED)


def test_custom_maskable_selection():
    class OnlyLast(MaskedNet):
        def maskable_parameter_names(self):
            return ["net.3.weight"]

    model = OnlyLast()
    model.install_masked_noise()
    assert model.masked_parameter_names == ["net.3.weight"]

    class Bad(MaskedNet):
        def maskable_parameter_names(self):
            return ["net.9.weight"]

    with pytest.raises(ValueError, match=r"unknown: \['net.9.weight'\]"):
        Bad().install_masked_noise()


def test_round_argument_errors():
    model = make()
    with pytest.raises(ValueError, match="`total_steps` must be a positive integer, got 0"):
        model.begin_masked_noise_round(noise_for(model), total_steps=0)
    with pytest.raises(ValueError, match="Noise is given for"):
        model.begin_masked_noise_round({"net.0.weight": torch.zeros(8, 6)}, total_steps=1)
    with pytest.raises(RuntimeError, match="without begin_masked_noise_round"):
        model.end_masked_noise_round()


def test_a_round_that_never_ended_is_closed_by_the_next():
    model = make()
    model.begin_masked_noise_round(noise_for(model), total_steps=2)
    model.begin_masked_noise_round(noise_for(model), total_steps=2)  # e.g. the previous client raised
    model.end_masked_noise_round()
    assert all(model.get_parameter(n).requires_grad for n in MASKED)
