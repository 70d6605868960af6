"""ClientLossRecorder: each client's mean task loss and regulariser, kept apart, read once."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from torch import Tensor

from fl_lightning import _lightning_compat as compat
from fl_lightning.algorithms.shared.algorithm import ClientContext, ClientUpdate
from fl_lightning.callbacks.client_loss import ClientLossRecorder
from fl_lightning.callbacks.federated_callback import FederatedCallback
from fl_lightning.mixins.regularized import REGULARIZER, TASK_LOSS
from fl_lightning.models import MLP

from ..loops.test_batched_clients import synthetic_data
from ..quiet import quiet_trainer
from ..recording_logger import RecordingLogger


def test_means_of_plain_losses_and_reset_after_reading():
    recorder = ClientLossRecorder()
    for value in (1.0, 2.0, 6.0):
        recorder.record(torch.tensor(value))
    assert recorder.pop_means() == {"train_loss": pytest.approx(3.0)}
    assert recorder.pop_means() == {}  # the next client starts from nothing


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_the_mean_is_a_running_float32_sum_bit_for_bit(dtype: torch.dtype):
    """What the batched executor's per-step float32 sums give (and this recorder gave as one): a float32 tensor
    added step by step, then divided by the steps."""
    generator = torch.Generator().manual_seed(0)
    for steps, scale in ((1, 1.0), (7, 1e-6), (60, 3e3), (200, 1.0)):
        losses = (torch.randn(steps, generator=generator) * scale).abs().to(dtype).unbind()
        recorder = ClientLossRecorder()
        running = torch.zeros((), dtype=torch.float32)
        for loss in losses:
            recorder.record(loss)
            running = running + loss.float()
        assert recorder.pop_means()["train_loss"] == float(running / steps), (steps, scale)


def test_task_loss_and_regularizer_kept_apart():
    recorder = ClientLossRecorder()
    for task, term in ((1.0, 0.5), (3.0, 1.5)):
        recorder.record({"loss": torch.tensor(task + term), TASK_LOSS: torch.tensor(task), REGULARIZER: torch.tensor(term)})
    assert recorder.pop_means() == {"train_loss": pytest.approx(2.0), "train_regularizer": pytest.approx(1.0)}


def test_outputs_without_a_loss_are_skipped():
    recorder = ClientLossRecorder()
    recorder.record(None)
    recorder.record({"logits": torch.zeros(2)})
    recorder.record({"loss": torch.tensor(4.0)})
    assert recorder.pop_means() == {"train_loss": pytest.approx(4.0)}


class ReturnsLosses(MLP):
    """Keeps every loss its ``training_step`` returns, per client."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.returned: dict[int, list[float]] = {}
        self.client: int | None = None

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        loss = super().training_step(batch, batch_idx)
        self.returned.setdefault(self.client, []).append(float(loss))
        return loss


class TracksClient(FederatedCallback):
    def __init__(self) -> None:
        self.train_losses: dict[int, float] = {}

    def on_client_start(self, trainer: Any, pl_module: Any, client: ClientContext) -> None:
        pl_module.client = client.client_id

    def on_client_end(self, trainer: Any, pl_module: Any, client: ClientContext, update: ClientUpdate) -> None:
        self.train_losses[client.client_id] = update.metrics["train_loss"]


@pytest.mark.parametrize("executor", ["lightning", "lean", "auto"])
def test_train_loss_is_what_training_step_returned_whatever_the_accumulation(executor: str) -> None:
    """Lightning's step output holds the loss divided by accumulate_grad_batches (issue 37: round/train_loss
    was 1.121 against the returned mean 2.241 with accumulation 2); the client's and round's train_loss are
    the returned loss. ("batched" refuses gradient accumulation.)"""
    torch.manual_seed(0)
    model = ReturnsLosses(in_features=12, hidden=(16,), num_classes=4, lr=0.1)
    tracker, logger = TracksClient(), RecordingLogger()
    trainer = quiet_trainer(
        max_epochs=1, clients_per_round=3, client_executor=executor, accumulate_grad_batches=2, logger=logger, callbacks=[tracker]
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # explicit lean names the accumulation it skips
        trainer.fit(model, datamodule=synthetic_data())
    returned = {client: sum(losses) / len(losses) for client, losses in model.returned.items()}
    assert tracker.train_losses == pytest.approx(returned, rel=1e-6)
    (round_loss,) = [metrics["round/train_loss"] for _, metrics in logger.records if "round/train_loss" in metrics]
    assert round_loss == pytest.approx(sum(returned.values()) / len(returned), rel=1e-6)


def test_a_mixins_task_loss_is_kept_under_accumulation() -> None:
    """A step that gives its task loss itself (a mixin's term added) keeps it: Lightning divides only "loss"."""
    result = compat._keeping_returned_loss(TASK_LOSS).from_training_step_output(
        {"loss": torch.tensor(3.0), TASK_LOSS: torch.tensor(2.0)}, normalize=2
    )
    assert (float(result.loss), float(result.extra[TASK_LOSS])) == (1.5, 2.0)
    plain = compat._keeping_returned_loss(TASK_LOSS).from_training_step_output(torch.tensor(3.0), normalize=2)
    assert (float(plain.loss), float(plain.extra[TASK_LOSS])) == (1.5, 3.0)
    assert TASK_LOSS not in compat._keeping_returned_loss(TASK_LOSS).from_training_step_output(torch.tensor(3.0)).extra
