"""Small masked models and quiet trainers for the FedMRN / compression tests."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from fl_lightning import FederatedTrainer
from fl_lightning.data import Digits, Dirichlet, FederatedDataModule
from fl_lightning.mixins import MaskedNoiseMixin
from fl_lightning.models import ClassificationModule

QUIET: dict[str, Any] = {
    "accelerator": "cpu",
    "logger": False,
    "enable_checkpointing": False,
    "enable_progress_bar": False,
    "enable_model_summary": False,
    "num_sanity_val_steps": 0,
    "limit_val_batches": 0,
}


class TinyMasked(MaskedNoiseMixin, ClassificationModule):
    """64 -> hidden -> 10, bias-free linear layers (all weights masked), optional BatchNorm."""

    def __init__(self, *, hidden: int = 16, batch_norm: bool = False, lr: float = 0.1) -> None:
        super().__init__(num_classes=10, lr=lr)
        norm = [nn.BatchNorm1d(hidden)] if batch_norm else []
        self.net = nn.Sequential(nn.Linear(64, hidden, bias=False), *norm, nn.ReLU(), nn.Linear(hidden, 10, bias=False))
        self.probabilities: list[float] = []

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        self.probabilities.append(self.masking_probability)
        return loss


def tiny(seed: int = 0, **kwargs: Any) -> TinyMasked:
    torch.manual_seed(seed)
    return TinyMasked(**kwargs)


def digits(num_clients: int = 6, batch_size: int = 32) -> FederatedDataModule:
    return FederatedDataModule(
        Digits(split="train"), Digits(split="test"), partitioner=Dirichlet(alpha=0.5), num_clients=num_clients, batch_size=batch_size
    )


def trainer(**kwargs: Any) -> FederatedTrainer:
    return FederatedTrainer(**{**QUIET, **kwargs})
