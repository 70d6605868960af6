"""An ordinary Lightning project, written as a user would, for the federating tests.

Its batches are dicts made by its own ``collate_fn``, and its loaders drop the last partial batch.
Importable by ``class_path`` (``tests.data.user_project.UserDataModule``) from YAML configs.
"""

from __future__ import annotations

from typing import Any

import torch
from lightning.pytorch import LightningDataModule, LightningModule
from torch import Tensor
from torch.utils.data import DataLoader, TensorDataset


def dict_collate(samples: list[tuple[Tensor, Tensor]]) -> dict[str, Tensor]:
    """``(x, y)`` samples as one ``{"x": ..., "y": ...}`` batch."""
    return {"x": torch.stack([x for x, _ in samples]), "y": torch.stack([y for _, y in samples])}


class UserDataModule(LightningDataModule):
    """``num_samples`` two-feature samples of three classes, in dict batches of ``batch_size``."""

    def __init__(self, num_samples: int = 40, batch_size: int = 4, drop_last: bool = True) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(0)
        self.data = TensorDataset(torch.randn(num_samples, 2, generator=generator), torch.arange(num_samples) % 3)
        self.batch_size, self.drop_last = batch_size, drop_last

    def train_dataloader(self) -> DataLoader[Any]:
        return DataLoader(self.data, self.batch_size, shuffle=True, drop_last=self.drop_last, collate_fn=dict_collate)

    def val_dataloader(self) -> DataLoader[Any]:
        return DataLoader(self.data, self.batch_size, collate_fn=dict_collate)

    def on_after_batch_transfer(self, batch: dict[str, Tensor], dataloader_idx: int) -> dict[str, Tensor]:
        # A GPU augmentation would go here; marking the batch shows that the hook ran, with a trainer.
        return {**batch, "hooked": torch.tensor(self.trainer is not None)}


class UserModule(LightningModule):
    """A linear classifier reading dict batches; records the batch sizes it trained and validated on."""

    def __init__(self, lr: float = 0.1) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 3)
        self.lr = lr
        self.trained: list[int] = []
        self.validated: list[int] = []
        self.hooked: list[bool] = []

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        self.trained.append(len(batch["y"]))
        self.hooked.append(bool(batch.get("hooked", False)))
        return torch.nn.functional.cross_entropy(self.layer(batch["x"]), batch["y"])

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        self.validated.append(len(batch["y"]))
        self.log("val_loss", torch.nn.functional.cross_entropy(self.layer(batch["x"]), batch["y"]), batch_size=len(batch["y"]))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr)
