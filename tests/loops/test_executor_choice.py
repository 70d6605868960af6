"""``client_executor="auto"``: lean whenever it gives Lightning's weights, Lightning otherwise, and why."""

from __future__ import annotations

import logging

import pytest
import torch
from lightning.pytorch.callbacks import Callback

from fl_lightning.models import MLP
from tests.integration.conftest import digits_data, quiet_trainer


def _fit(model: MLP, **kwargs) -> tuple[MLP, object]:
    trainer = quiet_trainer(**{"max_epochs": 3, "clients_per_round": 4, "local_epochs": 2, **kwargs})
    trainer.fit(model, datamodule=digits_data(num_clients=8))
    return model, trainer


def _model(cls: type[MLP] = MLP) -> MLP:
    torch.manual_seed(0)
    return cls(in_features=64, hidden=[32], lr=0.1, momentum=0.9)


def test_auto_picks_lean_and_equals_lightning_bit_for_bit(caplog: pytest.LogCaptureFixture) -> None:
    reference, _ = _fit(_model(), client_executor="lightning")
    with caplog.at_level(logging.INFO):
        auto, trainer = _fit(_model(), client_executor="auto")
    assert trainer.fit_loop.executor == "lean"
    assert "client_executor='auto' runs clients with the lean executor" in caplog.text
    assert caplog.text.count("client_executor='auto'") == 1  # said once
    for name, value in reference.state_dict().items():
        assert torch.equal(auto.state_dict()[name], value), name
    assert trainer.global_step == _fit(_model(), client_executor="lightning")[1].global_step  # lean counts its steps


class _BatchEndHook(MLP):
    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        pass


class _StepLogging(MLP):
    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        self.log("step_loss", loss, on_step=True, on_epoch=False)
        return loss


class _CountingCallback(Callback):
    def __init__(self) -> None:
        self.batches = 0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.batches += 1


@pytest.mark.parametrize(
    ("model_class", "kwargs", "reason"),
    [
        (_BatchEndHook, {}, "_BatchEndHook.on_train_batch_end"),
        (_StepLogging, {}, "on_step logging of ['step_loss']"),
        (MLP, {"gradient_clip_val": 1.0}, "gradient clipping (gradient_clip_val=1.0)"),
        (MLP, {"callbacks": [_CountingCallback()]}, "_CountingCallback.on_train_batch_start"),
    ],
    ids=["module-hook", "on-step-logging", "clipping", "callback-hook"],
)
def test_auto_picks_lightning_when_lean_could_differ_and_says_why(model_class, kwargs, reason, caplog) -> None:
    with caplog.at_level(logging.INFO):
        _, trainer = _fit(_model(model_class), client_executor="auto", **kwargs)
    assert trainer.fit_loop.executor == "lightning"
    assert reason in caplog.text
    for callback in kwargs.get("callbacks", []):
        assert callback.batches == trainer.global_step  # every step went through Lightning's hooks


@pytest.mark.parametrize(
    ("kwargs", "skipped"),
    [
        ({"callbacks": [_CountingCallback()]}, "_CountingCallback.on_train_batch_start"),
        ({"gradient_clip_val": 1.0}, "gradient clipping (gradient_clip_val=1.0)"),
    ],
    ids=["callback-hook", "clipping"],
)
def test_explicit_lean_warns_what_it_skips(kwargs, skipped) -> None:
    with pytest.warns(UserWarning, match=r"client_executor='lean' skips .*") as record:
        _, trainer = _fit(_model(), client_executor="lean", **kwargs)
    assert trainer.fit_loop.executor == "lean"
    assert [skipped in str(w.message) for w in record].count(True) == 1  # named, once
    for callback in kwargs.get("callbacks", []):
        assert callback.batches == 0  # what the warning says: the hook never ran


def test_explicit_lean_is_silent_when_it_skips_nothing(recwarn: pytest.WarningsRecorder) -> None:
    _fit(_model(), client_executor="lean")
    assert not [w for w in recwarn if "client_executor='lean'" in str(w.message)]


class _StepLoggingLater(_StepLogging):
    """Logs ``step_loss`` per step from the start, ``late_norm`` per step from the second round on, and
    ``epoch_loss`` per round only."""

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        if self.current_epoch >= 1:
            self.log("late_norm", loss.detach() * 2)  # in training_step, on_step defaults to True
        self.log("epoch_loss", loss, on_step=False, on_epoch=True, batch_size=len(batch[1]))
        return loss


def test_explicit_lean_warns_once_naming_each_per_step_metric_it_does_not_log(recwarn: pytest.WarningsRecorder) -> None:
    """Issue 37, item 7: explicit lean dropped self.log(on_step=True) values without a word."""
    _fit(_model(_StepLoggingLater), client_executor="lean")
    messages = [str(w.message) for w in recwarn if "does not send per-step metrics" in str(w.message)]
    assert len(messages) == 2, messages  # once per metric, the later one when it first appears
    assert "_StepLoggingLater.training_step logs 'step_loss'" in messages[0]
    assert "logs 'late_norm'" in messages[1] and "step_loss" not in messages[1]
    assert not [m for m in messages if "epoch_loss" in m]  # on_epoch values still reach the round's row
