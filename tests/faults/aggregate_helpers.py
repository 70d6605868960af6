"""Small federations and callbacks shared by the aggregation fault tests."""

from __future__ import annotations

import copy
from typing import Any

import lightning.pytorch as pl
import torch

from fl_lightning import FederatedCallback, FederatedTrainer
from fl_lightning.data import FederatedDataModule, InMemoryDataset
from fl_lightning.models import LogisticRegression

from ..integration.conftest import QUIET

NUM_CLIENTS = 4
SAMPLES_PER_CLIENT = 40


def tiny_data(num_clients: int = NUM_CLIENTS, seed: int = 0, **kwargs: Any) -> FederatedDataModule:
    """``num_clients`` IID clients of 40 samples (3 features, 2 classes): float32, sample weights of 40."""
    g = torch.Generator().manual_seed(seed)
    n = num_clients * SAMPLES_PER_CLIENT
    train = InMemoryDataset(inputs=torch.randn(n, 3, generator=g), labels=torch.randint(0, 2, (n,), generator=g), num_classes=2)
    test = InMemoryDataset(inputs=torch.randn(8, 3, generator=g), labels=torch.randint(0, 2, (8,), generator=g), num_classes=2)
    return FederatedDataModule(train, test, num_clients=num_clients, batch_size=20, **kwargs)


def tiny_model() -> LogisticRegression:
    torch.manual_seed(0)
    return LogisticRegression(in_features=3, num_classes=2, lr=0.1)


def tiny_trainer(**kwargs: Any) -> FederatedTrainer:
    return FederatedTrainer(**{**QUIET, "limit_val_batches": 0, "local_steps": 2, **kwargs})


class Poison(FederatedCallback):
    """Replaces every floating-point tensor of the victims' updates with ``value``: their first
    ``limit`` updates (default all)."""

    def __init__(self, victims: set[int], value: float, limit: int | None = None) -> None:
        self.victims, self.value, self.left = victims, value, limit

    def on_client_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, client: Any, update: Any) -> None:
        if client.client_id not in self.victims or self.left == 0:
            return
        self.left = None if self.left is None else self.left - 1
        for tensor in update.payload.values():
            if tensor.is_floating_point():
                tensor.fill_(self.value)


class RoundRecorder(FederatedCallback):
    """Every round's metrics, and the global model at the start and end of every round."""

    def __init__(self) -> None:
        self.metrics: list[dict[str, float]] = []
        self.before: list[dict[str, torch.Tensor]] = []
        self.after: list[dict[str, torch.Tensor]] = []

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.before.append(copy.deepcopy(pl_module.state_dict()))

    def on_round_aggregated(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, round_idx: int, metrics: dict[str, float]
    ) -> None:
        self.metrics.append(dict(metrics))
        self.after.append(copy.deepcopy(pl_module.state_dict()))


def finite(module: torch.nn.Module) -> bool:
    return all(torch.isfinite(t).all() for t in module.state_dict().values() if t.is_floating_point())


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
