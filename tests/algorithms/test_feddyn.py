"""FedDyn (Acar et al. 2021) through FederatedTrainer against a plain-PyTorch Algorithm 1, and its
errors, resume and refusals."""

from __future__ import annotations

import pytest
import torch

from fl_lightning import CoordinateMedian, DPFedAvg, FedAvg, FedDyn, FederatedTrainer, LinearTermMixin, NormClip, ProximalMixin
from fl_lightning.algorithms.shared.summable import can_shard

from ..integration.conftest import QUIET
from .quadratic import Quadratic, quadratic_data
from .stateful_regression import CLIENTS_PER_ROUND, LR, client_batches, fit, initial_weight, mse_gradient, resume_pair

N = 8


def reference(trainer: FederatedTrainer, alpha: float) -> tuple[torch.Tensor, torch.Tensor, dict[int, torch.Tensor]]:
    """Algorithm 1 of the paper, written from it: ``(theta, h, {k: grad L_k(theta_k)})`` after the run's
    rounds, on the clients the run selected and the batches each trained on."""
    theta = initial_weight()
    h = torch.zeros_like(theta)
    gradients: dict[int, torch.Tensor] = {}
    for round_idx, active in enumerate(trainer.fit_loop.history):
        solutions = []
        for k in active:
            w, g_k = theta.clone(), gradients.get(k, torch.zeros_like(theta))
            for x, y in client_batches(trainer, round_idx, k):
                # SGD on L_k(w) - <g_k, w> + alpha/2 ||w - theta^{t-1}||^2
                w = w - LR * (mse_gradient(w, x, y) - g_k + alpha * (w - theta))
            gradients[k] = g_k - alpha * (w - theta)  # the first-order condition's update
            solutions.append(w)
        h = h - alpha / N * sum(w - theta for w in solutions)
        theta = torch.stack(solutions).mean(dim=0) - h / alpha
    return theta, h, gradients


@pytest.mark.parametrize(("executor", "alpha"), [("lightning", 0.1), ("lean", 0.1), ("batched", 0.1), ("lightning", 0.5)])
def test_matches_a_plain_pytorch_algorithm_1(executor, alpha):
    model, trainer = fit(FedDyn(alpha=alpha), client_executor=executor)
    history = trainer.fit_loop.history
    assert all(len(s) == CLIENTS_PER_ROUND for s in history) and len({c for s in history for c in s}) > CLIENTS_PER_ROUND
    theta, h, gradients = reference(trainer, alpha)
    torch.testing.assert_close(model.net.weight.detach(), theta, rtol=0, atol=1e-9)
    algorithm = trainer.algorithm
    torch.testing.assert_close(algorithm.h["net.weight"], h, rtol=0, atol=1e-9)
    assert algorithm.gradients.ids() == sorted(gradients)
    for k, expected in gradients.items():
        torch.testing.assert_close(algorithm.gradients.get(k)["net.weight"], expected, rtol=0, atol=1e-9)
    torch.testing.assert_close(h, sum(gradients.values()) / N, rtol=0, atol=1e-12)  # h = (1/m) sum_k grad L_k
    fedavg, _ = fit(FedAvg(weighting="uniform"))
    assert not torch.allclose(fedavg.net.weight.detach(), theta, atol=1e-4)


def test_resume_equals_an_uninterrupted_run(tmp_path):
    straight, resumed = resume_pair(lambda: FedDyn(alpha=0.1), tmp_path)
    assert torch.equal(straight.lightning_module.net.weight, resumed.lightning_module.net.weight)
    a, b = straight.algorithm, resumed.algorithm
    assert torch.equal(a.h["net.weight"], b.h["net.weight"])
    assert a.gradients.ids() == b.gradients.ids()
    for (_, ga), (_, gb) in zip(a.gradients.items(), b.gradients.items()):
        assert torch.equal(ga["net.weight"], gb["net.weight"])


def test_a_checkpoint_naming_a_foreign_client_is_refused():
    _, trainer = fit(FedDyn(), rounds=1)
    state = trainer.algorithm.state_dict()
    state["gradients"]["entries"][-1] = state["gradients"]["entries"][trainer.fit_loop.history[0][0]]
    with pytest.raises(ValueError, match=rf"`gradients` names client -1, but this federation has clients 0..{N - 1}"):
        trainer.algorithm.load_state_dict(state)


def test_logs_the_norm_of_h():
    _, trainer = fit(FedDyn(alpha=0.1), rounds=2)
    expected = torch.linalg.vector_norm(trainer.algorithm.h["net.weight"])
    assert float(trainer.callback_metrics["round/h_norm"]) == pytest.approx(float(expected))


@pytest.mark.parametrize("bad", [0, -0.1, float("inf"), float("nan"), False, None])
def test_bad_alpha(bad):
    with pytest.raises(ValueError, match=rf"`alpha` must be a finite number > 0, got {bad!r}"):
        FedDyn(alpha=bad)


class LinearOnly(LinearTermMixin, Quadratic):
    pass


@pytest.mark.parametrize(("module", "mixin"), [(Quadratic, "LinearTermMixin"), (LinearOnly, "ProximalMixin")])
def test_a_module_without_either_term_is_rejected(module, mixin):
    trainer = FederatedTrainer(**{**QUIET, "max_epochs": 1, "local_steps": 1, "algorithm": FedDyn()})
    with pytest.raises(TypeError, match=rf"FedDyn needs a LightningModule that inherits `fl_lightning.{mixin}`"):
        trainer.fit(module(), datamodule=quadratic_data())


class Bypassing(LinearTermMixin, ProximalMixin, Quadratic):
    training_step = Quadratic.training_step  # defined in the class that lists the mixins: they never run


def test_a_training_step_that_bypasses_the_mixins_is_refused():
    trainer = FederatedTrainer(**{**QUIET, "max_epochs": 1, "local_steps": 1, "limit_val_batches": 0, "algorithm": FedDyn()})
    with pytest.raises(TypeError, match=r"Bypassing.training_step bypasses LinearTermMixin.training_step and ProximalMixin.training_step, so FedDyn's term "
        r"was never applied in 1 training step.*class Fixed\(LinearTermMixin, ProximalMixin, Bypassing\)"):
        trainer.fit(Bypassing(), datamodule=quadratic_data())


def test_refuses_dp_robust_rules_and_update_bounds():
    assert not can_shard(FedDyn()) and FedDyn().gathers_updates  # shards by gathering, not by a weighted sum
    with pytest.raises(ValueError, match="DPFedAvg needs a synchronous algorithm whose aggregation is a sum"):
        DPFedAvg(algorithm=FedDyn(), clip_norm=1.0, noise_multiplier=1.0)
    with pytest.raises(ValueError, match="CoordinateMedian replaces the average of a group of client updates, but FedDyn"):
        CoordinateMedian(algorithm=FedDyn())
    with pytest.raises(ValueError, match=r"update_bound=NormClip\(...\) would change the deltas"):
        fit(FedDyn(), rounds=1, update_bound=NormClip(max_norm=1.0))
