"""Small masked models and quiet trainers for the FedMRN / FedPM / compression tests."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from fl_lightning import FederatedTrainer
from fl_lightning.data import Digits, Dirichlet, FederatedDataModule
from fl_lightning.mixins import MaskedNoiseMixin, ProbabilityMaskMixin
from fl_lightning.models import ClassificationModule

from ..integration.conftest import QUIET as INTEGRATION_QUIET

QUIET: dict[str, Any] = {**INTEGRATION_QUIET, "limit_val_batches": 0}


class Tiny(ClassificationModule):
    """64 -> hidden -> 10, bias-free linear layers (all weights maskable), optional BatchNorm."""

    def __init__(self, *, hidden: int = 16, batch_norm: bool = False, lr: float = 0.1, optimizer: str = "sgd") -> None:
        super().__init__(num_classes=10, lr=lr, optimizer=optimizer)  # type: ignore[arg-type]
        norm = [nn.BatchNorm1d(hidden)] if batch_norm else []
        self.net = nn.Sequential(nn.Linear(64, hidden, bias=False), *norm, nn.ReLU(), nn.Linear(hidden, 10, bias=False))


class TinyMasked(MaskedNoiseMixin, Tiny):
    """:class:`Tiny` for FedMRN; records the PM probability of every step."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.probabilities: list[float] = []

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        self.probabilities.append(self.masking_probability)
        return loss


class TinyProbabilityMasked(ProbabilityMaskMixin, Tiny):
    """:class:`Tiny` for FedPM."""


def tiny(seed: int = 0, **kwargs: Any) -> TinyMasked:
    torch.manual_seed(seed)
    return TinyMasked(**kwargs)


def tiny_pm(seed: int = 0, **kwargs: Any) -> TinyProbabilityMasked:
    torch.manual_seed(seed)
    return TinyProbabilityMasked(**kwargs)


def digits(num_clients: int = 6, batch_size: int = 32, val_fraction: float | None = None) -> FederatedDataModule:
    return FederatedDataModule(
        Digits(split="train"),
        Digits(split="test"),
        val_fraction=val_fraction,
        partitioner=Dirichlet(alpha=0.5),
        num_clients=num_clients,
        batch_size=batch_size,
    )


def trainer(**kwargs: Any) -> FederatedTrainer:
    return FederatedTrainer(**{**QUIET, **kwargs})


def states_under_each_executor(make_model: Callable[[], nn.Module], make_algorithm: Callable[[], Any]) -> list[dict]:
    """Final ``state_dict`` of the same 2-round fit under the ``lightning`` and the ``lean`` client executor."""
    states = []
    for executor in ("lightning", "lean"):
        model = make_model()
        run = trainer(max_epochs=2, clients_per_round=3, local_epochs=1, algorithm=make_algorithm(), client_executor=executor)
        run.fit(model, datamodule=digits())
        states.append(model.state_dict())
    return states
