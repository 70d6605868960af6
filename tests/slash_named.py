"""A tiny federation and a module that logs under its own names (``val/acc``), for report tests."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from fl_lightning.data import FederatedDataModule, InMemoryDataset
from fl_lightning.models import MLP


def blobs(n: int, seed: int) -> InMemoryDataset:
    """Three Gaussian blobs in 4-d: learnable in a few rounds, not perfectly."""
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(3, (n,), generator=generator)
    inputs = torch.randn(n, 4, generator=generator) + 1.5 * F.one_hot(labels, 4).float()
    return InMemoryDataset(inputs=inputs, labels=labels, num_classes=3)


def blob_federation(**kwargs: object) -> FederatedDataModule:
    """300 training samples (20 % of them the validation split) over 5 clients, 90 test samples."""
    return FederatedDataModule(blobs(300, seed=0), blobs(90, seed=1), **{"val_fraction": 0.2, "num_clients": 5, **kwargs})


class SlashNamedMLP(MLP):
    """Logs ``val/acc`` (progress bar), ``val/nll`` (not) and ``test/acc``: no ``val_acc`` anywhere.

    Also a ``model.class_path`` for ``fl-lightning`` runs (studies' subprocesses import it).
    """

    @classmethod
    def for_blobs(cls) -> SlashNamedMLP:
        """Sized for :func:`blob_federation`."""
        return cls(in_features=4, hidden=(8,), num_classes=3, lr=0.1)

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._log_named(batch, "val")

    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._log_named(batch, "test")

    def _log_named(self, batch: tuple[Tensor, Tensor], stage: str) -> None:
        x, y = batch
        logits = self(x)
        self.log(f"{stage}/acc", (logits.argmax(-1) == y).float().mean(), batch_size=len(y), prog_bar=True)
        self.log(f"{stage}/nll", F.cross_entropy(logits, y), batch_size=len(y))
