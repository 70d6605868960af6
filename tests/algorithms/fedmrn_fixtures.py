"""Small masked models and quiet trainers for the FedMRN / FedPM / compression tests."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fl_lightning import FederatedTrainer
from fl_lightning.data import Digits, Dirichlet, FederatedDataModule, InMemoryDataset
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


class SequenceModel(pl.LightningModule):
    """Embedding (12 tokens) -> ``rnn`` (GRU or LSTM) -> linear head over 3 classes; ``poisoned`` makes its
    training loss NaN (a diverged client)."""

    def __init__(self, rnn: type[nn.RNNBase] = nn.GRU) -> None:
        super().__init__()
        self.embedding = nn.Embedding(12, 8)
        self.rnn = rnn(8, 16, batch_first=True)
        self.head = nn.Linear(16, 3)
        self.poisoned = False

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        x, y = batch
        loss = F.cross_entropy(self.head(self.rnn(self.embedding(x))[0][:, -1]), y)
        return loss * float("nan") if self.poisoned else loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.5)


class SequenceMasked(MaskedNoiseMixin, SequenceModel):
    """:class:`SequenceModel` for FedMRN."""


def sequence_data(num_clients: int = 3) -> FederatedDataModule:
    """60 sequences of 6 tokens, labelled by their sum modulo 3."""
    tokens = torch.randint(0, 12, (60, 6), generator=torch.Generator().manual_seed(0))
    return FederatedDataModule(
        InMemoryDataset(inputs=tokens, labels=tokens.sum(dim=1) % 3, num_classes=3), num_clients=num_clients, batch_size=10
    )
