"""Every client executor, on each Lightning feature of a table, either gives the Lightning executor's
weights after 2 rounds or refuses/warns naming the feature: never silently different weights."""

from __future__ import annotations

import functools
import re
import warnings
from collections.abc import Callable
from typing import Any, NamedTuple

import pytest
import torch
from lightning.pytorch.callbacks import Callback
from torch import Tensor

from fl_lightning.models import MLP

from ..quiet import quiet_trainer
from .test_batched_clients import max_diff, synthetic_data
from .test_step_count import ScalesByStep, SkipsEveryThird

#: Weights equal to the Lightning executor's, after 2 rounds.
TOL = 1e-6


def shrink(module: torch.nn.Module) -> None:
    """A visible change of the weights, as a hook that acts would make."""
    with torch.no_grad():
        for p in module.parameters():
            p.mul_(0.9)


def halve_grads(module: torch.nn.Module) -> None:
    for p in module.parameters():
        if p.grad is not None:
            p.grad.mul_(0.5)


def mlp(**kwargs: Any) -> dict[str, Any]:
    return {"in_features": 12, "hidden": (16,), "num_classes": 4, "lr": 0.1, **kwargs}


class AfterBackward(MLP):
    def on_after_backward(self) -> None:
        halve_grads(self)


class BeforeOptimizerStep(MLP):
    def on_before_optimizer_step(self, optimizer: Any) -> None:
        halve_grads(self)


class OptimizerStep(MLP):
    def optimizer_step(self, *args: Any, **kwargs: Any) -> None:
        super().optimizer_step(*args, **kwargs)
        shrink(self)


class SkipsAfterFirstBatch(MLP):
    def on_train_batch_start(self, batch: Any, batch_idx: int) -> int | None:
        return -1 if batch_idx >= 1 else None  # Lightning ends the client's epoch


class BatchEnd(MLP):
    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        shrink(self)


class BeforeZeroGrad(MLP):
    def on_before_zero_grad(self, optimizer: Any) -> None:
        optimizer.param_groups[0]["lr"] *= 0.9  # called between forward and backward: the weights must stay


class DoubledBackward(MLP):
    def backward(self, loss: Tensor, *args: Any, **kwargs: Any) -> None:
        super().backward(2 * loss, *args, **kwargs)


class Manual(MLP):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.automatic_optimization = False

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        optimizer = self.optimizers()
        loss = super().training_step(batch, batch_idx)
        optimizer.zero_grad()
        self.manual_backward(loss)
        optimizer.step()
        return loss


class DoubledInputs(MLP):
    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        x, y = batch
        return 2 * x, y


class StepScheduler(MLP):
    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.7)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


class LogsPerStep(MLP):
    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        loss = super().training_step(batch, batch_idx)
        self.log("step_loss", loss, on_step=True)
        return loss


class CallbackAfterBackward(Callback):
    def on_after_backward(self, trainer: Any, pl_module: Any) -> None:
        halve_grads(pl_module)


class CallbackBatchStart(Callback):
    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        shrink(pl_module)


class CallbackBatchEnd(Callback):
    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        shrink(pl_module)


class CallbackBeforeOptimizerStep(Callback):
    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        halve_grads(pl_module)


class Feature(NamedTuple):
    model: Callable[[], MLP]
    #: What a refusal or a warning must name.
    named: str
    trainer: dict[str, Any] = {}
    callbacks: Callable[[], list[Callback]] = list
    #: The feature acts on the weights (so an executor that skipped it silently would fail here).
    changes_weights: bool = True


FEATURES = {
    "module.on_after_backward": Feature(lambda: AfterBackward(**mlp()), "AfterBackward.on_after_backward"),
    "module.on_before_optimizer_step": Feature(lambda: BeforeOptimizerStep(**mlp()), "on_before_optimizer_step"),
    "module.optimizer_step": Feature(lambda: OptimizerStep(**mlp()), "OptimizerStep.optimizer_step"),
    "module.on_train_batch_start=-1": Feature(lambda: SkipsAfterFirstBatch(**mlp()), "on_train_batch_start"),
    "module.on_train_batch_end": Feature(lambda: BatchEnd(**mlp()), "BatchEnd.on_train_batch_end"),
    "module.on_before_zero_grad": Feature(lambda: BeforeZeroGrad(**mlp()), "BeforeZeroGrad.on_before_zero_grad"),
    "module.backward": Feature(lambda: DoubledBackward(**mlp()), "DoubledBackward.backward"),
    "callback.on_after_backward": Feature(
        lambda: MLP(**mlp()), "CallbackAfterBackward.on_after_backward", callbacks=lambda: [CallbackAfterBackward()]
    ),
    "callback.on_train_batch_start": Feature(
        lambda: MLP(**mlp()), "CallbackBatchStart.on_train_batch_start", callbacks=lambda: [CallbackBatchStart()]
    ),
    "callback.on_train_batch_end": Feature(
        lambda: MLP(**mlp()), "CallbackBatchEnd.on_train_batch_end", callbacks=lambda: [CallbackBatchEnd()]
    ),
    "callback.on_before_optimizer_step": Feature(
        lambda: MLP(**mlp()),
        "CallbackBeforeOptimizerStep.on_before_optimizer_step",
        callbacks=lambda: [CallbackBeforeOptimizerStep()],
    ),
    "precision=bf16-mixed": Feature(lambda: MLP(**mlp()), "bf16-mixed", {"precision": "bf16-mixed"}),
    "precision=64-true": Feature(lambda: MLP(**mlp()), "64-true", {"precision": "64-true"}, changes_weights=False),
    "gradient clipping": Feature(lambda: MLP(**mlp()), "gradient_clip_val|gradient clipping", {"gradient_clip_val": 0.05}),
    "gradient accumulation": Feature(lambda: MLP(**mlp()), "accumulate_grad_batches", {"accumulate_grad_batches": 2}),
    "manual optimization": Feature(lambda: Manual(**mlp()), "automatic optimization|manual optimization", changes_weights=False),
    "batch-transfer hook": Feature(lambda: DoubledInputs(**mlp()), "on_after_batch_transfer|batch-transfer hooks"),
    "step LR scheduler": Feature(lambda: StepScheduler(**mlp()), "interval='step' LR scheduler"),
    "epoch LR scheduler": Feature(
        lambda: MLP(**mlp(lr_scheduler=functools.partial(torch.optim.lr_scheduler.StepLR, step_size=1, gamma=0.5))), "StepLR"
    ),
    "momentum and weight decay": Feature(lambda: MLP(**mlp(momentum=0.9, weight_decay=1e-2)), "momentum"),
    "on_step logging": Feature(lambda: LogsPerStep(**mlp()), "step_loss", changes_weights=False),
    "global_step in training_step": Feature(lambda: ScalesByStep(**mlp()), "global_step"),
    "training_step returns None": Feature(lambda: SkipsEveryThird(**mlp()), "returns None"),
    "Adam": Feature(lambda: MLP(**mlp(optimizer="adam")), "Adam", changes_weights=False),
}


class Outcome(NamedTuple):
    weights: dict[str, Tensor] | None
    #: The refusal's and the warnings' messages.
    messages: list[str]


def run(executor: str, feature: Feature | None) -> Outcome:
    torch.manual_seed(0)
    model = feature.model() if feature else MLP(**mlp())
    trainer = quiet_trainer(
        max_epochs=2,
        clients_per_round=4,
        client_executor=executor,
        callbacks=feature.callbacks() if feature else [],
        **(feature.trainer if feature else {}),
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            trainer.fit(model, datamodule=synthetic_data())
        except (ValueError, RuntimeError) as error:
            return Outcome(None, [str(error)])
    weights = {name: t.detach().clone() for name, t in model.state_dict().items()}
    return Outcome(weights, [str(w.message) for w in caught])


@functools.cache
def lightning_weights(feature: str | None) -> dict[str, Tensor]:
    outcome = run("lightning", FEATURES[feature] if feature else None)
    assert outcome.weights is not None, outcome.messages
    return outcome.weights


@pytest.mark.parametrize("executor", ["auto", "lean", "batched"])
@pytest.mark.parametrize("feature", list(FEATURES))
def test_equal_to_lightning_or_refused_or_warned_by_name(feature: str, executor: str) -> None:
    spec = FEATURES[feature]
    reference = lightning_weights(feature)
    if spec.changes_weights:  # else skipping it silently would pass unnoticed
        assert max_diff(reference, lightning_weights(None)) > 1e-3
    outcome = run(executor, spec)
    named = [m for m in outcome.messages if re.search(spec.named, m)]
    if outcome.weights is None:
        assert named, f"{executor} refused {feature} without naming it: {outcome.messages}"
    elif not named:
        assert max_diff(outcome.weights, reference) <= TOL, f"{executor} silently differs on {feature}"
