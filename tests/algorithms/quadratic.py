"""Quadratic devices F_k(w) = ||w - c_k||^2 / 2 whose federated fixed points have closed forms."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch

from fl_lightning import FederatedTrainer
from fl_lightning.data import FederatedDataModule, InMemoryDataset, Natural

from ..integration.conftest import QUIET

CENTRES = torch.tensor([[0.0, 0.0], [4.0, 0.0], [0.0, 4.0], [4.0, 4.0]], dtype=torch.float64)


class Quadratic(pl.LightningModule):
    """w in R^2; a batch of copies of c_k gives the loss ||w - c_k||^2 / 2, so full-batch GD has
    Delta_k = (1 - (1 - lr)^s) (c_k - w)."""

    def __init__(self, lr: float = 0.05, lr_scheduler: Any = None) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))
        self.lr, self.lr_scheduler_factory = lr, lr_scheduler
        self.forward_calls = self.optimizer_steps = 0

    def training_step(self, batch, batch_idx):
        self.forward_calls += 1
        x, _ = batch
        return 0.5 * ((self.w - x) ** 2).sum(dim=1).mean()

    def sample_metrics(self, batch):
        x, _ = batch
        return {"loss": 0.5 * ((self.w - x) ** 2).sum(dim=1)}

    def on_before_optimizer_step(self, optimizer) -> None:
        self.optimizer_steps += 1

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=self.lr)
        if self.lr_scheduler_factory is None:
            return optimizer
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": self.lr_scheduler_factory(optimizer), "interval": "epoch"}}


def quadratic_data(centres: torch.Tensor = CENTRES, samples: int = 10, holdout_fraction: float = 0.0) -> FederatedDataModule:
    """One device per centre, each holding ``samples`` copies of its centre."""
    num = len(centres)
    inputs = centres.repeat_interleave(samples, dim=0)
    dataset = InMemoryDataset(inputs=inputs, labels=torch.zeros(len(inputs), dtype=torch.int64), num_classes=2)
    dataset.client_ids = np.repeat(np.arange(num), samples)
    return FederatedDataModule(
        dataset,
        partitioner=Natural(),
        num_clients=num,
        batch_size=samples,  # full batch: every step sees all of the device's samples
        holdout_fraction=holdout_fraction,
    )


def quadratic_trainer(**kwargs: Any) -> FederatedTrainer:
    defaults = {**QUIET, "precision": "64-true", "limit_val_batches": 0, "local_steps": 5}
    return FederatedTrainer(**{**defaults, **kwargs})
