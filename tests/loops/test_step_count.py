"""``trainer.global_step`` read inside ``training_step``, and steps that return ``None``, behave as under the
Lightning executor in every executor, or the executor says it cannot (issue 37, item 8)."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from torch import Tensor

from fl_lightning.algorithms.shared.algorithm import ClientContext, ClientUpdate
from fl_lightning.callbacks.federated_callback import FederatedCallback
from fl_lightning.models import MLP

from ..quiet import quiet_trainer
from .test_batched_clients import max_diff, synthetic_data


class ScalesByStep(MLP):
    """A loss scaled by the step count: its weights depend on when ``global_step`` advances."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.seen: list[int] = []

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        self.seen.append(self.global_step)
        return super().training_step(batch, batch_idx) * (1 + 0.1 * self.global_step)


class SkipsEveryThird(MLP):
    """Returns ``None`` (Lightning skips the backward pass, and still counts the step) on every third batch."""

    def training_step(self, batch: Any, batch_idx: int) -> Tensor | None:
        loss = super().training_step(batch, batch_idx)
        return None if batch_idx % 3 == 1 else loss


class Steps(FederatedCallback):
    """Each client's ``completed_steps`` and its update's ``num_steps``, in training order."""

    def __init__(self) -> None:
        self.steps: list[tuple[int, int, int, int]] = []

    def on_client_end(self, trainer: Any, pl_module: Any, client: ClientContext, update: ClientUpdate) -> None:
        self.steps.append((client.round_idx, client.client_id, client.completed_steps, update.num_steps))


def fit(model: MLP, executor: str) -> tuple[dict[str, Tensor], list[tuple[int, int, int, int]], int, list[str]]:
    """Weights, client steps, the final ``global_step`` and the warnings of a 2-round fit."""
    steps = Steps()
    trainer = quiet_trainer(max_epochs=2, clients_per_round=3, client_executor=executor, callbacks=[steps])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(model, datamodule=synthetic_data())
    weights = {name: t.detach().clone() for name, t in model.state_dict().items()}
    return weights, steps.steps, trainer.global_step, [str(w.message) for w in caught]


def mlp(cls: type[MLP]) -> MLP:
    torch.manual_seed(0)
    return cls(in_features=12, hidden=(16,), num_classes=4, lr=0.1, momentum=0.9)


@pytest.mark.parametrize("executor", ["lean", "auto"])
def test_global_step_read_in_training_step_advances_as_under_lightning(executor: str) -> None:
    """Under lean (and auto, which picks it) the count stayed at each client's start: weights 0.014 apart."""
    reference = mlp(ScalesByStep)
    expected, _, _, _ = fit(reference, "lightning")
    model = mlp(ScalesByStep)
    weights, _, _, _ = fit(model, executor)
    assert model.seen == reference.seen == list(range(len(reference.seen)))
    assert max_diff(weights, expected) == 0.0


def test_batched_warns_by_name_that_global_step_cannot_advance_per_client() -> None:
    _, _, _, messages = fit(mlp(ScalesByStep), "batched")
    assert [m for m in messages if "ScalesByStep.training_step reads self.global_step" in m]
    _, _, _, plain = fit(mlp(MLP), "batched")
    assert not [m for m in plain if "global_step" in m]


@pytest.mark.parametrize("executor", ["lean", "auto"])
def test_skipped_steps_count_as_under_lightning(executor: str) -> None:
    """Lightning counts a step that returns None (7 steps where lean counted 6), and FedNova normalises by it."""
    expected_weights, expected_steps, expected_global, _ = fit(mlp(SkipsEveryThird), "lightning")
    weights, steps, global_step, _ = fit(mlp(SkipsEveryThird), executor)
    assert steps == expected_steps and all(completed == num for _, _, completed, num in steps)
    assert global_step == expected_global == sum(completed for _, _, completed, _ in steps)
    assert max_diff(weights, expected_weights) == 0.0


def test_batched_refuses_a_step_that_returns_none_by_name() -> None:
    with pytest.raises(RuntimeError, match="SkipsEveryThird.training_step.*returns None"):
        fit(mlp(SkipsEveryThird), "batched")
