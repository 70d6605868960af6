"""The lean client executor gives the same weights as Lightning's epoch loop."""

from __future__ import annotations

import pytest
import torch

from fl_lightning import FedProx
from fl_lightning.models import CNN, MLP

from ..integration.conftest import digits_data, quiet_trainer


def fit(executor: str, model_fn, as_image: bool = False, **kwargs):
    torch.manual_seed(0)
    model = model_fn()
    trainer = quiet_trainer(max_epochs=2, clients_per_round=4, client_executor=executor, **kwargs)
    trainer.fit(model, datamodule=digits_data(as_image=as_image))
    return model, trainer


@pytest.mark.parametrize(
    ("model_fn", "as_image", "kwargs"),
    [
        (lambda: MLP(in_features=64, hidden=(16,), lr=0.1, momentum=0.9), False, {"local_steps": 7}),
        (lambda: MLP(in_features=64, hidden=(16,), lr=0.1), False, {"algorithm": FedProx(mu=0.5)}),
        (lambda: CNN(in_channels=1, image_size=8, batch_norm=True, lr=0.05), True, {}),
    ],
    ids=["momentum-steps", "fedprox", "cnn-batchnorm"],
)
def test_lean_equals_lightning(model_fn, as_image, kwargs):
    lightning_model, lightning_trainer = fit("lightning", model_fn, as_image, **kwargs)
    lean_model, lean_trainer = fit("lean", model_fn, as_image, **kwargs)
    for (name, a), b in zip(lightning_model.state_dict().items(), lean_model.state_dict().values()):
        assert torch.equal(a, b), name
    assert lean_trainer.callback_metrics["round/train_loss"] == lightning_trainer.callback_metrics["round/train_loss"]
    assert lean_trainer.global_step == lightning_trainer.global_step > 0  # the lean executor counts its steps


class LogsTrainLoss(MLP):
    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        self.log("train_loss", loss, on_step=False, on_epoch=True, batch_size=len(batch[1]))
        return loss


def test_lean_keeps_epoch_logging():
    _, trainer = fit("lean", lambda: LogsTrainLoss(in_features=64, hidden=(8,)))
    assert "train_loss" in trainer.callback_metrics


class DoublesInputs(MLP):
    """Overrides a batch-transfer hook, so the lean path must call it (not the direct device move)."""

    calls = 0

    def on_after_batch_transfer(self, batch, dataloader_idx):
        DoublesInputs.calls += 1
        x, y = batch
        return 2 * x, y


def test_lean_calls_overridden_batch_transfer_hooks():
    lightning_model, _ = fit("lightning", lambda: DoublesInputs(in_features=64, hidden=(8,), lr=0.1))
    lightning_calls, DoublesInputs.calls = DoublesInputs.calls, 0
    lean_model, _ = fit("lean", lambda: DoublesInputs(in_features=64, hidden=(8,), lr=0.1))
    assert DoublesInputs.calls == lightning_calls > 0
    for (name, a), b in zip(lightning_model.state_dict().items(), lean_model.state_dict().values()):
        assert torch.equal(a, b), name


def test_bad_executor_name():
    with pytest.raises(ValueError, match="`client_executor` must be 'auto', 'lightning', 'lean' or 'batched', got 'fast'"):
        quiet_trainer(client_executor="fast")
