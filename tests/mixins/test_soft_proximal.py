"""ProximalMixin with several weighted centres (FedSoft's eq. 4): value, gradient, one SGD step, limits."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fl_lightning.mixins import ProximalMixin

from .test_proximal import _batch, _grads, _Linear

LAM = 0.7
U = [0.6, 0.3, 1e-4]


class _ProxLinear(ProximalMixin, _Linear):
    pass


def _centres(module: nn.Module, count: int = 3) -> list[dict[str, Tensor]]:
    g = torch.Generator().manual_seed(3)
    return [{n: p.detach() + torch.randn(p.shape, generator=g) for n, p in module.named_parameters()} for _ in range(count)]


def _by_hand(module: nn.Module, centres: list[dict[str, Tensor]], u: list[float]) -> float:
    return 0.5 * LAM * sum(
        us * sum(((p.detach() - c[n]) ** 2).sum().item() for n, p in module.named_parameters()) for us, c in zip(u, centres)
    )


def test_value_is_the_weighted_sum_of_squared_distances():
    module = _ProxLinear()
    centres = _centres(module)
    module.set_proximal_centers(centres, U, LAM)
    assert module.proximal_term().item() == pytest.approx(_by_hand(module, centres, U), rel=1e-6)
    plain = _Linear.training_step(module, _batch(), 0).item()
    assert module.training_step(_batch(), 0)["loss"].item() == pytest.approx(plain + _by_hand(module, centres, U), rel=1e-6)


def test_gradient_is_task_gradient_plus_lambda_weighted_pulls():
    module = _ProxLinear()
    centres = _centres(module)
    plain = _grads(module, _Linear.training_step(module, _batch(), 0))
    module.set_proximal_centers(centres, torch.tensor(U, dtype=torch.float64), LAM)
    prox = _grads(module, module.training_step(_batch(), 0)["loss"])
    for name, p in module.named_parameters():
        pull = sum(us * (p.detach() - c[name]) for us, c in zip(U, centres))
        torch.testing.assert_close(prox[name], plain[name] + LAM * pull, rtol=0, atol=1e-6, msg=name)
    assert all(not t.requires_grad and t.grad is None for c in centres for t in c.values())


def test_one_sgd_step_matches_the_hand_update():
    lr = 0.1
    module = _ProxLinear()
    centres = _centres(module)
    before = {n: p.detach().clone() for n, p in module.named_parameters()}
    plain = _grads(module, _Linear.training_step(module, _batch(), 0))
    module.set_proximal_centers(centres, U, LAM)
    optimizer = torch.optim.SGD(module.parameters(), lr=lr)
    optimizer.zero_grad()
    module.training_step(_batch(), 0)["loss"].backward()
    optimizer.step()
    for name, p in module.named_parameters():
        pull = sum(us * (before[name] - c[name]) for us, c in zip(U, centres))
        torch.testing.assert_close(p.detach(), before[name] - lr * (plain[name] + LAM * pull), rtol=0, atol=1e-6)


def test_lambda_zero_is_plain_training_bit_for_bit():
    module = _ProxLinear()
    module.set_proximal_centers(_centres(module), U, 0.0)
    assert module.training_step(_batch(), 0) is module.last_output


def test_one_centre_with_unit_weight_is_fedprox():
    module = _ProxLinear()
    (centre,) = _centres(module, 1)
    module.set_proximal_centers([centre], [1.0], LAM)
    soft = module.proximal_term().item()
    module.set_proximal_center(centre, LAM)
    assert soft == pytest.approx(module.proximal_term().item(), rel=1e-6)


def test_a_single_centre_after_several_drops_the_constant():
    module = _ProxLinear()
    centres = _centres(module)
    module.set_proximal_centers(centres, U, LAM)
    module.set_proximal_center(centres[0], LAM)
    assert module.proximal_term().item() == pytest.approx(_by_hand(module, centres[:1], [1.0]), rel=1e-6)


@pytest.mark.parametrize(
    ("weights", "lam", "match"),
    [
        (U, -0.1, r"`lam` must be >= 0, got -0.1"),
        ([0.5, -0.1, 0.2], LAM, r"Centre weights must be >= 0"),
        ([0.5], LAM, "one weight per centre"),
    ],
)
def test_bad_input(weights, lam, match):
    module = _ProxLinear()
    with pytest.raises(ValueError, match=match):
        module.set_proximal_centers(_centres(module), weights, lam)


def test_loss_through_mse_is_unchanged_by_the_centres_dtype():
    module = _ProxLinear()
    centres = [{n: t.double() for n, t in c.items()} for c in _centres(module)]
    module.set_proximal_centers(centres, U, LAM)
    x, y = _batch()
    assert module.training_step((x, y), 0)["loss"].dtype == F.mse_loss(module.fc(x), y).dtype
