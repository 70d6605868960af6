"""ClientLossRecorder: each client's mean task loss and regulariser, kept apart, read once."""

from __future__ import annotations

import pytest
import torch

from fl_lightning.callbacks.client_loss import ClientLossRecorder
from fl_lightning.mixins.regularized import REGULARIZER, TASK_LOSS


def test_means_of_plain_losses_and_reset_after_reading():
    recorder = ClientLossRecorder()
    for value in (1.0, 2.0, 6.0):
        recorder.record(torch.tensor(value))
    assert recorder.pop_means() == {"train_loss": pytest.approx(3.0)}
    assert recorder.pop_means() == {}  # the next client starts from nothing


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
