"""FedALIGN (Ravi & Shomorony): the admission rule, its limits, its fixed point and its baselines."""

from __future__ import annotations

import math

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from fl_lightning import FedAvg, FederatedTrainer
from fl_lightning.algorithms.shared.epsilon_schedules import ConstantEpsilon, LinearEpsilon, StepEpsilon
from fl_lightning.algorithms.fedalign import AllClients, FedALIGN, PriorityOnly, alignment_decision
from fl_lightning.algorithms.local_only import LocalOnly
from fl_lightning.algorithms.shared.wrapper import AlgorithmWrapper
from fl_lightning.models import MLP

from ..integration.conftest import QUIET, digits_data
from .quadratic import Quadratic, quadratic_data, quadratic_trainer

PRIORITY = [0, 1, 2, 3]


# --- the rule, on mocked losses (F = 1.0, eps = 0.2) -----------------------------------------


@pytest.mark.parametrize(
    ("loss", "opted_in", "accepted"),
    [(0.85, True, True), (1.15, True, True), (1.25, False, False), (0.7, True, False)],
)
def test_decision_with_mocked_losses(loss, opted_in, accepted):
    decision = alignment_decision(loss, 1.0, 0.2, strict=False, two_sided=True)
    assert (decision.opted_in, decision.accepted) == (opted_in, accepted)


def test_one_sided_acceptance_takes_every_client_that_opts_in():
    assert alignment_decision(0.7, 1.0, 0.2, strict=False, two_sided=False).accepted


@pytest.mark.parametrize("boundary", [1.2, 0.8])
def test_boundary_follows_strictness(boundary):
    assert alignment_decision(boundary, 1.0, 0.2, strict=False, two_sided=True).accepted
    assert not alignment_decision(boundary, 1.0, 0.2, strict=True, two_sided=True).accepted


def test_epsilon_schedules():
    assert ConstantEpsilon(0.2)(99) == 0.2
    linear = LinearEpsilon(start=0.4, end=0.0, begin=10, finish=20)
    assert [linear(r) for r in (0, 10, 15, 20, 30)] == pytest.approx([0.4, 0.4, 0.2, 0.0, 0.0])
    assert [StepEpsilon(start=0.4, factor=0.5, every=10)(r) for r in (0, 9, 10, 25)] == pytest.approx([0.4, 0.4, 0.2, 0.1])
    assert StepEpsilon(start=math.inf, factor=0.0, every=1)(1) == 0.0


# --- limits through the real loop (digits, 8 clients, 4 of them priority) -------------------


def fit(algorithm, *, rounds: int = 2, seed: int = 0, **kwargs):
    torch.manual_seed(0)
    model = MLP(in_features=64, hidden=(16,), lr=0.1)
    trainer = FederatedTrainer(**{**QUIET, "max_epochs": rounds, "seed": seed, "algorithm": algorithm, **kwargs})
    trainer.fit(model, datamodule=digits_data())
    return model, trainer


def assert_same(a, b):
    for (name, x), y in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(x, y), name


class FixedSelection(FedAvg):
    def select_clients(self, round_idx):
        return PRIORITY


def test_zero_epsilon_strict_is_priority_only_fedavg():
    align, trainer = fit(FedALIGN(priority=PRIORITY, epsilon=0.0, strict=True, warmup_fraction=0.0))
    assert trainer.algorithm.accepted_history == [[], []]
    assert_same(align, fit(PriorityOnly(priority=PRIORITY, warmup_fraction=0.0))[0])
    assert_same(align, fit(FixedSelection())[0])


def test_infinite_epsilon_without_warmup_is_all_clients_fedavg():
    align, trainer = fit(FedALIGN(priority=PRIORITY, epsilon=math.inf, warmup_fraction=0.0))
    assert trainer.algorithm.accepted_history == [[4, 5, 6, 7]] * 2
    assert_same(align, fit(FedAvg())[0])
    assert_same(align, fit(AllClients(priority=PRIORITY, warmup_fraction=0.0))[0])


def test_warmup_rounds_admit_no_nonpriority_client():
    _, trainer = fit(FedALIGN(priority=PRIORITY, epsilon=math.inf, warmup_fraction=0.5), rounds=4)
    assert trainer.algorithm.accepted_history == [[], [], [4, 5, 6, 7], [4, 5, 6, 7]]
    assert trainer.fit_loop.history[0] == PRIORITY


def test_round_metrics_and_priority_evaluation():
    _, trainer = fit(FedALIGN(priority=PRIORITY, epsilon=0.3, warmup_fraction=0.0, evaluate_priority=True), rounds=2)
    metrics = trainer.callback_metrics
    for key in ("priority_loss", "epsilon", "accepted_nonpriority", "theta", "priority_test_acc", "priority_test_loss"):
        assert f"round/{key}" in metrics, key
    assert 0 < metrics["round/priority_test_acc"] <= 1
    assert metrics["round/epsilon"] == pytest.approx(0.3)


def test_partial_participation_applies_the_rule_to_sampled_clients():
    _, trainer = fit(FedALIGN(priority=PRIORITY, epsilon=math.inf, warmup_fraction=0.0), clients_per_round=0.5, rounds=4)
    for selected, accepted in zip(trainer.fit_loop.history, trainer.algorithm.accepted_history):
        assert len(selected) <= 4 and set(accepted) <= set(selected) - set(PRIORITY)
        assert set(selected) - set(PRIORITY) == set(accepted)


def test_resume_and_determinism_keep_the_accepted_sets(tmp_path):
    def algorithm():
        return FedALIGN(priority=PRIORITY, epsilon=0.4, warmup_fraction=0.25)

    checkpoint = ModelCheckpoint(dirpath=tmp_path, every_n_epochs=1, save_top_k=-1, filename="{epoch}")
    straight, trainer = fit(algorithm(), rounds=4, callbacks=[checkpoint], enable_checkpointing=True)
    accepted = trainer.algorithm.accepted_history
    assert any(accepted), "the test needs some admitted non-priority clients"
    again, trainer_again = fit(algorithm(), rounds=4)
    assert trainer_again.algorithm.accepted_history == accepted
    assert_same(straight, again)

    torch.manual_seed(0)
    resumed = MLP(in_features=64, hidden=(16,), lr=0.1)
    trainer = FederatedTrainer(**{**QUIET, "max_epochs": 4, "algorithm": algorithm()})
    trainer.fit(resumed, datamodule=digits_data(), ckpt_path=tmp_path / "epoch=1.ckpt")
    assert trainer.algorithm.accepted_history == accepted
    assert_same(straight, resumed)


# --- quadratic toy: the aligned client helps, the far one is kept out ------------------------

CENTRES = torch.tensor([[0.5, 0.0], [-0.5, 0.0], [0.0, 0.0], [5.0, 5.0]], dtype=torch.float64)
W_STAR = torch.zeros(2, dtype=torch.float64)  # optimum of the two priority devices


def test_download_is_the_wrapped_algorithms():
    """FedALIGN is an AlgorithmWrapper: what a client downloads is the wrapped algorithm's count."""
    state = {"w": torch.zeros(3)}
    assert isinstance(FedALIGN(priority=[0]), AlgorithmWrapper)
    assert FedALIGN(priority=[0]).download_bytes(state) == 12  # FedAvg: the float32 global model
    assert FedALIGN(priority=[0], algorithm=LocalOnly()).download_bytes(state) == 0  # LocalOnly sends nothing


def quadratic_run(algorithm) -> tuple[torch.Tensor, object]:
    model = Quadratic(lr=0.1)
    trainer = quadratic_trainer(max_epochs=60, algorithm=algorithm)
    trainer.fit(model, datamodule=quadratic_data(CENTRES))
    return model.w.detach(), trainer


def test_quadratic_toy():
    w_align, trainer = quadratic_run(FedALIGN(priority=[0, 1], epsilon=0.2, warmup_fraction=0.1))
    w_all, _ = quadratic_run(AllClients(priority=[0, 1], warmup_fraction=0.1))
    late = trainer.algorithm.accepted_history[10:]
    assert all(a == [2] for a in late), late  # aligned device in, far device out
    assert torch.allclose(w_align, W_STAR, atol=1e-9)  # the aligned device does not move the fixed point
    assert torch.linalg.norm(w_align - W_STAR) < torch.linalg.norm(w_all - W_STAR)


# --- bad input ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"epsilon": -0.1}, r"`epsilon` must be >= 0 \(inf allowed\), got -0.1"),
        ({"warmup_fraction": 1.0}, r"`warmup_fraction` must be in \[0, 1\), got 1.0"),
        ({"warmup_fraction": -0.1}, r"`warmup_fraction` must be in \[0, 1\)"),
        ({"priority": 0}, "`priority` must be an integer >= 1"),
        ({"metric": "f1"}, "`metric` must be 'loss' or 'accuracy'"),
    ],
)
def test_bad_constructor_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        FedALIGN(**{"priority": PRIORITY, **kwargs})


@pytest.mark.parametrize(
    ("priority", "match"),
    [([], "The priority set is empty"), ([0, 99], r"Priority client ids \[99\] are out of range: ids are 0..7"), (None, "No priority set")],
)
def test_bad_priority_sets_fail_before_training(priority, match):
    with pytest.raises(ValueError, match=match):
        fit(FedALIGN(priority=priority), rounds=1)
