"""FedAsync (Xie et al. 2019) against a plain-PyTorch replay of its update rule on quadratic devices."""

from __future__ import annotations

import pytest
import torch

from fl_lightning import FedAsync, ProximalMixin
from fl_lightning.algorithms.fedasync import staleness_weight
from fl_lightning.participation.speed import ConstantDelay

from .quadratic import CENTRES, Quadratic, quadratic_data, quadratic_trainer

A, B, C = 0, 1, 2
LR, STEPS = 0.1, 2
DELAYS = ConstantDelay([1.0, 1.5, 4.25])


class ProximalQuadratic(ProximalMixin, Quadratic):
    pass


def local_model(start: torch.Tensor, centre: torch.Tensor, rho: float) -> torch.Tensor:
    """``STEPS`` full-batch GD steps on ||w - c||^2/2 + rho/2 ||w - start||^2 (the paper's g_{x_tau})."""
    w = start.clone()
    for _ in range(STEPS):
        w = w - LR * ((w - centre) + rho * (w - start))
    return w


def replay(arrivals, *, alpha, staleness, a, b, rho=0.0, train_at="dispatch"):
    """x_t = (1 - alpha_t) x_{t-1} + alpha_t x_new, alpha_t = alpha s(t - tau), over the loop's event trace."""
    versions = [torch.zeros(2, dtype=torch.float64)]
    for j, (_, client, pulled) in enumerate(arrivals):
        start = versions[pulled] if train_at == "dispatch" else versions[j]
        x_new = local_model(start, CENTRES[client], rho)
        alpha_t = alpha * staleness_weight(staleness, j + 1 - pulled, a=a, b=b)
        versions.append((1 - alpha_t) * versions[j] + alpha_t * x_new)
    return versions


def fit(aggregations: int, module: Quadratic | None = None, **kwargs):
    algorithm = FedAsync(delays=DELAYS, **kwargs)
    module = module if module is not None else Quadratic(lr=LR)
    trainer = quadratic_trainer(max_epochs=aggregations, algorithm=algorithm, local_steps=STEPS)
    trainer.fit(module, datamodule=quadratic_data(CENTRES[:3]))
    return module, trainer


def test_golden_trace_updates_on_every_arrival():
    _, trainer = fit(8)
    assert trainer.fit_loop.arrivals == [
        (1.0, A, 0), (1.5, B, 0), (2.0, A, 1), (3.0, B, 2), (3.0, A, 3), (4.0, A, 5), (4.25, C, 0), (4.5, B, 4),
    ]  # fmt: skip
    assert trainer.fit_loop.history == [[A], [B], [A], [B], [A], [A], [C], [B]]


@pytest.mark.parametrize(
    ("staleness", "a", "b"), [("constant", 0.5, 4), ("polynomial", 0.5, 4), ("hinge", 10.0, 4), ("hinge", 1.0, 0)]
)
@pytest.mark.parametrize("train_at", ["dispatch", "arrival"])
def test_matches_the_plain_pytorch_replay(staleness, a, b, train_at):
    module, trainer = fit(8, alpha=0.6, staleness=staleness, a=a, b=b, train_at=train_at)
    expected = replay(trainer.fit_loop.arrivals, alpha=0.6, staleness=staleness, a=a, b=b, train_at=train_at)
    assert torch.allclose(module.w.detach(), expected[-1], atol=1e-12, rtol=0)
    # C's update (staleness 6, t - tau = 7) has alpha_t = 0.6 s(7).
    assert trainer.algorithm.influence[C] == pytest.approx(0.6 * staleness_weight(staleness, 7, a=a, b=b))


def test_proximal_term_matches_the_replay():
    module, trainer = fit(6, ProximalQuadratic(lr=LR), alpha=0.9, staleness="polynomial", rho=0.5)
    expected = replay(trainer.fit_loop.arrivals, alpha=0.9, staleness="polynomial", a=0.5, b=4, rho=0.5)
    assert torch.allclose(module.w.detach(), expected[-1], atol=1e-12, rtol=0)


def test_logged_mixing_weight_and_staleness():
    _, trainer = fit(7, alpha=0.5, staleness="hinge", a=10.0, b=4)
    metrics = trainer.callback_metrics
    assert metrics["round/alpha"] == pytest.approx(0.5 / 31)  # C: t - tau = 7 > b, 1 / (10 (7 - 4) + 1)
    assert metrics["round/mean_staleness"] == 6.0


def test_same_seed_same_weights():
    first, _ = fit(5, staleness="polynomial")
    second, _ = fit(5, staleness="polynomial")
    assert torch.equal(first.w, second.w)


def test_staleness_functions_closed_forms():
    assert [staleness_weight("constant", g, a=0.5, b=4) for g in (1, 9)] == [1.0, 1.0]
    assert staleness_weight("polynomial", 8, a=0.5, b=4) == pytest.approx(1 / 3)
    assert [staleness_weight("hinge", g, a=10, b=4) for g in (1, 4, 5)] == [1.0, 1.0, pytest.approx(1 / 11)]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"alpha": 0.0}, r"`alpha` must be in \(0, 1\], got 0.0"),
        ({"alpha": 1.5}, r"`alpha` must be in \(0, 1\], got 1.5"),
        ({"staleness": "linear"}, r"`staleness` must be 'constant', 'polynomial' or 'hinge', got 'linear'"),
        ({"a": 0}, r"`a` must be a finite number > 0, got 0"),
        ({"b": -1}, r"`b` must be a finite number >= 0, got -1"),
        ({"rho": -0.1}, r"`rho` must be a finite number >= 0, got -0.1"),
    ],
)
def test_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        FedAsync(**kwargs)


def test_proximal_term_needs_the_mixin():
    with pytest.raises(TypeError, match=r"FedAsync needs a LightningModule that inherits `fl_lightning.ProximalMixin`"):
        fit(1, rho=0.1)
