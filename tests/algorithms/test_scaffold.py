"""SCAFFOLD (Karimireddy et al. 2020) through FederatedTrainer against a plain-PyTorch Algorithm 1
(option II), and its errors, resume and refusals."""

from __future__ import annotations

import pytest
import torch

from fl_lightning import SCAFFOLD, CoordinateMedian, DPFedAvg, FedAvg, FederatedTrainer, LinearTermMixin, NormClip
from fl_lightning.algorithms.shared.summable import can_shard
from fl_lightning.utils.saved_state import InvalidStateError

from ..integration.conftest import QUIET
from .quadratic import Quadratic, quadratic_data
from .stateful_regression import CLIENTS_PER_ROUND, LR, ROUNDS, client_batches, fit, initial_weight, mse_gradient, resume_pair

N = 8


def reference(trainer: FederatedTrainer, global_lr: float) -> tuple[torch.Tensor, torch.Tensor, dict[int, torch.Tensor]]:
    """Algorithm 1 of the paper, written from it: ``(x, c, {i: c_i})`` after the run's rounds, on the
    clients the run selected and the batches each trained on."""
    x = initial_weight()
    c = torch.zeros_like(x)
    c_i: dict[int, torch.Tensor] = {}
    for round_idx, sampled in enumerate(trainer.fit_loop.history):
        delta_y, delta_c = [], []
        for i in sampled:
            y, ci = x.clone(), c_i.get(i, torch.zeros_like(x))
            batches = client_batches(trainer, round_idx, i)
            for xb, yb in batches:  # line 10
                y = y - LR * (mse_gradient(y, xb, yb) - ci + c)
            ci_plus = ci - c + (x - y) / (len(batches) * LR)  # line 12, option II
            delta_y.append(y - x)
            delta_c.append(ci_plus - ci)
            c_i[i] = ci_plus
        x = x + global_lr * torch.stack(delta_y).mean(dim=0)  # line 16
        c = c + torch.stack(delta_c).sum(dim=0) / N  # line 17: (|S|/N) * mean
    return x, c, c_i


@pytest.mark.parametrize(("executor", "global_lr"), [("lightning", 1.0), ("lean", 1.0), ("batched", 1.0), ("lightning", 0.5)])
def test_matches_a_plain_pytorch_algorithm_1(executor, global_lr):
    model, trainer = fit(SCAFFOLD(global_lr=global_lr), client_executor=executor)
    history = trainer.fit_loop.history
    assert len(history) == ROUNDS and all(len(s) == CLIENTS_PER_ROUND for s in history)
    assert len({c for s in history for c in s}) < N or len(set(map(tuple, history))) > 1  # partial participation
    x, c, c_i = reference(trainer, global_lr)
    torch.testing.assert_close(model.net.weight.detach(), x, rtol=0, atol=1e-9)
    algorithm = trainer.algorithm
    torch.testing.assert_close(algorithm.control["net.weight"], c, rtol=0, atol=1e-9)
    assert algorithm.client_controls.ids() == sorted(c_i)
    for i, expected in c_i.items():
        torch.testing.assert_close(algorithm.client_controls.get(i)["net.weight"], expected, rtol=0, atol=1e-9)
    # c = (1/N) sum_i c_i, the invariant lines 12 and 17 keep
    torch.testing.assert_close(c, sum(c_i.values()) / N, rtol=0, atol=1e-12)
    # the corrections matter: FedAvg from the same start ends elsewhere
    fedavg, _ = fit(FedAvg(weighting="uniform"))
    assert not torch.allclose(fedavg.net.weight.detach(), x, atol=1e-4)


def test_sends_and_uploads_twice_the_model_and_logs_the_control_norm():
    """Algorithm 1 line 6 sends (x, c), line 13 uploads (Delta y_i, Delta c_i): both twice the model's bytes."""
    _, trainer = fit(SCAFFOLD(), rounds=1)
    model_bytes = 10 * 8  # Linear(10 -> 1) without bias, float64
    assert trainer.callback_metrics["round/upload_bytes"] == CLIENTS_PER_ROUND * 2 * model_bytes
    assert trainer.callback_metrics["round/download_bytes"] == CLIENTS_PER_ROUND * 2 * model_bytes
    expected = torch.linalg.vector_norm(trainer.algorithm.control["net.weight"])
    assert float(trainer.callback_metrics["round/control_norm"]) == pytest.approx(float(expected))


def test_resume_equals_an_uninterrupted_run(tmp_path):
    straight, resumed = resume_pair(SCAFFOLD, tmp_path)
    assert torch.equal(straight.lightning_module.net.weight, resumed.lightning_module.net.weight)
    a, b = straight.algorithm, resumed.algorithm
    assert torch.equal(a.control["net.weight"], b.control["net.weight"])
    assert a.client_controls.ids() == b.client_controls.ids()
    for (_, sa), (_, sb) in zip(a.client_controls.items(), b.client_controls.items()):
        assert torch.equal(sa["net.weight"], sb["net.weight"])


def test_round_off_on_a_near_zero_control_is_not_taken_for_an_edit():
    """A resumed 30-round run (8-4000-3 MLP, SCAFFOLD) was refused: a dead unit's c was 1.8245e-9 against a mean
    c_i of 1.7998e-9, its float32 round-off, while the tensor's c reached 0.075. An edit at the tensor's scale is."""
    _, trainer = fit(SCAFFOLD(), rounds=1)
    scaffold, n = trainer.algorithm, N
    clients = scaffold.client_controls.ids()
    for value, refused in ((1.7998e-9, False), (0.07, True)):
        c_i = torch.zeros(1, 10, dtype=torch.float64)
        c_i[0, 0], c_i[0, 1] = 0.075 * n, value * n  # one client holds the whole sum, so c = its c_i / N
        for cid in clients:
            scaffold.client_controls.put(cid, {"net.weight": c_i if cid == clients[0] else torch.zeros_like(c_i)})
        scaffold.control["net.weight"] = torch.tensor([[0.075, 1.8245e-9, *[0.0] * 8]], dtype=torch.float64)
        if refused:
            with pytest.raises(InvalidStateError, match=r"`control\.net\.weight` is not the mean .* off by up to 0\.07"):
                scaffold.check_restored(1)
        else:
            scaffold.check_restored(1)


def test_a_checkpoint_naming_a_foreign_client_is_refused():
    _, trainer = fit(SCAFFOLD(), rounds=1)
    state = trainer.algorithm.state_dict()
    state["client_controls"]["entries"][N] = state["client_controls"]["entries"][trainer.fit_loop.history[0][0]]
    with pytest.raises(ValueError, match=rf"`client_controls` names client {N}, but this federation has clients 0..{N - 1}"):
        trainer.algorithm.load_state_dict(state)


@pytest.mark.parametrize("bad", [0, -1.0, float("inf"), float("nan"), True, "1"])
def test_bad_global_lr(bad):
    with pytest.raises(ValueError, match=rf"`global_lr` \(eta_g\) must be a finite number > 0, got {bad!r}"):
        SCAFFOLD(global_lr=bad)


def test_a_module_without_the_linear_term_is_rejected():
    trainer = FederatedTrainer(**{**QUIET, "max_epochs": 1, "local_steps": 1, "algorithm": SCAFFOLD()})
    with pytest.raises(TypeError, match=r"SCAFFOLD needs a LightningModule that inherits `fl_lightning.LinearTermMixin`"):
        trainer.fit(Quadratic(), datamodule=quadratic_data())


class Bypassing(LinearTermMixin, Quadratic):
    training_step = Quadratic.training_step  # defined in the class that lists the mixin: the mixin never runs


def test_a_training_step_that_bypasses_the_mixin_is_refused():
    trainer = FederatedTrainer(**{**QUIET, "max_epochs": 1, "local_steps": 1, "limit_val_batches": 0, "algorithm": SCAFFOLD()})
    with pytest.raises(TypeError, match=r"Bypassing.training_step bypasses LinearTermMixin.training_step, so SCAFFOLD's term"):
        trainer.fit(Bypassing(), datamodule=quadratic_data())


def test_an_optimizer_other_than_plain_sgd_warns():
    with pytest.warns(UserWarning, match=r"assume plain SGD local steps; the module's optimizer is SGD with momentum"):
        fit(SCAFFOLD(), rounds=1, momentum=0.9)


class StepScheduled(LinearTermMixin, Quadratic):
    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=self.lr)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def test_a_step_interval_scheduler_warns():
    trainer = FederatedTrainer(**{**QUIET, "max_epochs": 1, "local_steps": 2, "limit_val_batches": 0, "algorithm": SCAFFOLD()})
    with pytest.warns(UserWarning, match=r"divide by K \* lr, but an interval='step' LR scheduler changes lr within a round"):
        trainer.fit(StepScheduled(), datamodule=quadratic_data())


def test_refuses_dp_robust_rules_and_update_bounds():
    assert not can_shard(SCAFFOLD()) and SCAFFOLD().gathers_updates  # shards by gathering, not by a weighted sum
    with pytest.raises(ValueError, match="DPFedAvg needs a synchronous algorithm whose aggregation is a sum"):
        DPFedAvg(algorithm=SCAFFOLD(), clip_norm=1.0, noise_multiplier=1.0)
    with pytest.raises(ValueError, match="CoordinateMedian replaces the average of a group of client updates, but SCAFFOLD"):
        CoordinateMedian(algorithm=SCAFFOLD())
    with pytest.raises(ValueError, match=r"update_bound=NormClip\(...\) would bound SCAFFOLD's Delta y_i"):
        fit(SCAFFOLD(), rounds=1, update_bound=NormClip(max_norm=1.0))
