"""Training-step outputs keep the task loss and added terms apart, and the loop logs them apart."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from lightning.pytorch.callbacks import Callback

from fl_lightning import FedAvg, FedProx
from fl_lightning.callbacks import ClientLossRecorder
from fl_lightning.mixins.regularized import add_regularizer, split_losses
from fl_lightning.models import MLP
from tests.integration.conftest import digits_data, quiet_trainer


def test_terms_from_several_mixins_add_up_and_the_task_loss_stays_the_first() -> None:
    loss = torch.tensor(2.0, requires_grad=True)
    output = add_regularizer(add_regularizer(loss, torch.tensor(0.5)), torch.tensor(0.25))
    assert output["loss"].item() == 2.75 and output["loss"].requires_grad
    assert split_losses(output) == (torch.tensor(2.0), torch.tensor(0.75))
    assert not output["task_loss"].requires_grad


@pytest.mark.parametrize(
    ("output", "expected"),
    [(torch.tensor(1.5), (1.5, None)), ({"loss": torch.tensor(1.5), "extra": 1}, (1.5, None)), (None, (None, None)), ({"x": 1}, (None, None))],
)
def test_split_losses_of_plain_outputs(output: Any, expected: tuple[float | None, float | None]) -> None:
    loss, regularizer = split_losses(output)
    assert (None if loss is None else loss.item(), regularizer) == expected


def test_recorder_averages_each_part_over_the_steps_that_report_it() -> None:
    recorder = ClientLossRecorder()
    recorder.record(add_regularizer(torch.tensor(1.0), torch.tensor(0.2)))
    recorder.record(add_regularizer(torch.tensor(3.0), torch.tensor(0.4)))
    assert recorder.pop_means() == pytest.approx({"train_loss": 2.0, "train_regularizer": 0.3})
    recorder.record(torch.tensor(5.0))
    assert recorder.pop_means() == {"train_loss": 5.0}
    assert recorder.pop_means() == {}


class _TaskLosses(Callback):
    """The module's own task loss and the proximal term of every step, as the step saw them."""

    def __init__(self) -> None:
        self.task: list[float] = []
        self.term: list[float] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        x, y = batch
        with torch.no_grad():  # the weights the step's loss is computed at
            self.task.append(torch.nn.functional.cross_entropy(pl_module(x), y).item())

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.term.append(outputs["regularizer"].item())


class _RoundMetrics(Callback):
    def __init__(self) -> None:
        self.rows: list[dict[str, float]] = []

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self.rows.append({k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("round/train")})


@pytest.mark.parametrize("executor", ["lightning", "lean"])
def test_fedprox_logs_the_task_loss_as_train_loss_and_the_term_apart(executor: str) -> None:
    """One client per round, one step per client: the round's means are that step's values."""
    torch.manual_seed(0)
    steps, rounds = _TaskLosses(), _RoundMetrics()
    trainer = quiet_trainer(
        algorithm=FedProx(mu=1.0), clients_per_round=1, local_steps=1, max_epochs=3,
        client_executor=executor, callbacks=[steps, rounds],
    )  # fmt: skip
    trainer.fit(MLP(in_features=64, num_classes=10), datamodule=digits_data(num_clients=4))
    assert all(set(r) == {"round/train_loss", "round/train_regularizer"} for r in rounds.rows)
    # With one step per client the term is 0 (the step starts at the centre).
    assert [r["round/train_regularizer"] for r in rounds.rows] == [0.0, 0.0, 0.0]
    if executor == "lightning":  # the lean executor skips per-batch callbacks
        assert [r["round/train_loss"] for r in rounds.rows] == pytest.approx(steps.task, rel=1e-5)


def test_fedprox_train_loss_after_two_steps_excludes_the_term() -> None:
    """With two local steps the term is positive at the second step, and ``train_loss`` is the task loss alone."""
    torch.manual_seed(0)
    steps, rounds = _TaskLosses(), _RoundMetrics()
    trainer = quiet_trainer(algorithm=FedProx(mu=10.0), clients_per_round=1, local_steps=2, max_epochs=1, callbacks=[steps, rounds])
    trainer.fit(MLP(in_features=64, num_classes=10), datamodule=digits_data(num_clients=4))
    assert steps.term[1] > 0
    assert rounds.rows[0]["round/train_loss"] == pytest.approx(sum(steps.task) / 2, rel=1e-5)
    assert rounds.rows[0]["round/train_regularizer"] == pytest.approx(sum(steps.term) / 2, rel=1e-5)


def test_fedavg_logs_no_regularizer() -> None:
    rounds = _RoundMetrics()
    quiet_trainer(algorithm=FedAvg(), clients_per_round=2, local_steps=1, max_epochs=1, callbacks=[rounds]).fit(
        MLP(in_features=64, num_classes=10), datamodule=digits_data(num_clients=4)
    )
    assert set(rounds.rows[0]) == {"round/train_loss"}
