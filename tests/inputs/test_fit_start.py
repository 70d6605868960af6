"""Optimizers and schedulers that no round could train with are refused when the fit starts, with one line
naming them; a closure-based optimizer (LBFGS) runs through Lightning's loop under ``client_executor="auto"``."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from fl_lightning import FederatedTrainer
from fl_lightning.data import FederatedDataModule, InMemoryDataset
from fl_lightning.models import LogisticRegression

from ..quiet import QUIET


def _data() -> FederatedDataModule:
    g = torch.Generator().manual_seed(0)
    train = InMemoryDataset(inputs=torch.randn(40, 3, generator=g), labels=torch.randint(0, 2, (40,), generator=g), num_classes=2)
    val = InMemoryDataset(inputs=torch.randn(12, 3, generator=g), labels=torch.randint(0, 2, (12,), generator=g), num_classes=2)
    return FederatedDataModule(train, val=val, num_clients=4, batch_size=5, eval_batch_size=4)


class _Copied(LogisticRegression):
    def configure_optimizers(self) -> Any:
        return torch.optim.SGD([p.detach().clone().requires_grad_() for p in copy.deepcopy(self.net).parameters()], lr=0.1)


class _ZeroFrequency(LogisticRegression):
    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step", "frequency": 0}}


class _LBFGS(LogisticRegression):
    def configure_optimizers(self) -> Any:
        return torch.optim.LBFGS(self.parameters(), lr=0.1, max_iter=2)


def _fit(module: LogisticRegression, **kwargs: Any) -> FederatedTrainer:
    trainer = FederatedTrainer(**{**QUIET, "max_epochs": 1, **kwargs})
    trainer.fit(module, datamodule=_data())
    return trainer


@pytest.mark.parametrize(
    ("module", "pattern"),
    [
        (_Copied, r"^Optimizer 0 \(SGD\) of _Copied\.configure_optimizers holds 2 of its 2 tensors that are not the module's"),
        (_ZeroFrequency, r"^`frequency of the StepLR LR scheduler` must be an integer >= 1, got 0\.$"),
    ],
)
def test_an_optimizer_or_scheduler_no_round_can_train_with_is_refused_at_fit_start(module: type, pattern: str) -> None:
    with pytest.raises(ValueError, match=pattern) as caught:
        _fit(module(in_features=3, num_classes=2))
    assert "\n" not in str(caught.value)


def test_lbfgs_under_auto_trains_through_lightnings_loop() -> None:
    torch.manual_seed(0)
    module = _LBFGS(in_features=3, num_classes=2)
    before = module.net[1].weight.detach().clone()
    trainer = _fit(module)
    assert trainer.fit_loop.executor == "lightning"
    assert not torch.equal(module.net[1].weight, before)


@pytest.mark.parametrize("executor", ["lean", "batched"])
def test_lbfgs_under_an_executor_that_steps_without_a_closure_is_refused(executor: str) -> None:
    with pytest.raises(ValueError, match=rf"^client_executor='{executor}' calls optimizer.step\(\) without a closure, which LBFGS needs"):
        _fit(_LBFGS(in_features=3, num_classes=2), client_executor=executor)
