"""An ordinary Lightning project, made federated by changing three lines.

The first half of this file is plain PyTorch Lightning, written without federated learning
in mind: an MLP classifier of scikit-learn's bundled 8x8 digits and a datamodule that splits
them into training and validation sets. ``main`` then trains it either centrally (a plain
``Trainer``) or federated over 20 clients with Dirichlet(0.5) label skew, using FedProx:

    python examples/existing_project.py                 # federated (FedProx), 40 rounds, ~0.93 val_acc
    python examples/existing_project.py --centralised   # the same project, plain Lightning

The federated path differs from the centralised one in three lines, marked ``# FL (1/3)``
to ``# FL (3/3)``: the model gains :class:`~fl_lightning.ProximalMixin` (FedProx's proximal
term), ``Trainer`` becomes :class:`~fl_lightning.FederatedTrainer` (``max_epochs`` counts
rounds), and the datamodule is wrapped by
:meth:`~fl_lightning.data.FederatedDataModule.from_datamodule`, which partitions its training
set among the clients and keeps its validation set as the server's evaluation set.
"""

from __future__ import annotations

import argparse
from typing import Any

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset, random_split
from torchmetrics.classification import MulticlassAccuracy

from fl_lightning import FederatedTrainer, FedProx, ProximalMixin
from fl_lightning.data import Dirichlet, FederatedDataModule

# --------------------------------------------------------------------------------------
# The existing project: nothing federated below this line until `main`.
# --------------------------------------------------------------------------------------


class DigitsClassifier(pl.LightningModule):
    """A one-hidden-layer MLP on 8x8 digits, trained with SGD."""

    def __init__(self, hidden: int = 128, lr: float = 0.1) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, 10))
        self.val_acc = MulticlassAccuracy(num_classes=10, average="micro")

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss, on_step=False, on_epoch=True, batch_size=len(y))
        return loss

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        x, y = batch
        logits = self(x)
        self.val_acc(logits, y)
        self.log("val_loss", F.cross_entropy(logits, y), batch_size=len(y), prog_bar=True)
        self.log("val_acc", self.val_acc, batch_size=len(y), prog_bar=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


class DigitsDataModule(pl.LightningDataModule):
    """scikit-learn's 1,797 digits, pixels scaled to [0, 1], split 80/20 into train/val."""

    def __init__(self, batch_size: int = 16, val_fraction: float = 0.2, seed: int = 0) -> None:
        super().__init__()
        self.batch_size, self.val_fraction, self.seed = batch_size, val_fraction, seed

    def setup(self, stage: str | None = None) -> None:
        digits = load_digits()
        full = TensorDataset(
            torch.tensor(digits.data / 16.0, dtype=torch.float32), torch.tensor(digits.target, dtype=torch.long)
        )
        num_val = round(self.val_fraction * len(full))
        split = random_split(full, [len(full) - num_val, num_val], generator=torch.Generator().manual_seed(self.seed))
        # Materialised as TensorDatasets so that the labels are at hand without a pass over the data.
        self.train_set, self.val_set = (TensorDataset(*full[subset.indices]) for subset in split)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=512)


# --------------------------------------------------------------------------------------
# Making it federated.
# --------------------------------------------------------------------------------------


class FederatedDigitsClassifier(ProximalMixin, DigitsClassifier):  # FL (1/3): FedProx's proximal term
    """The same classifier; :class:`~fl_lightning.ProximalMixin` adds FedProx's proximal term to its loss."""


def main(federated: bool = True, max_epochs: int = 40, seed: int = 0, **trainer_kwargs: Any) -> float:
    """Trains the digits classifier and returns the final validation accuracy.

    Args:
        federated: train with FedProx over 20 clients (``max_epochs`` rounds of 10 clients, two
            local epochs each) instead of centrally (``max_epochs`` epochs).
        max_epochs: epochs, or rounds when federated.
        seed: seed of the initial weights, the data split and the client partition.
        **trainer_kwargs: forwarded to the ``Trainer`` (e.g. ``logger=False``).
    """
    pl.seed_everything(seed, verbose=False)
    # The model is tiny: the GPU would only add transfer time.
    trainer_kwargs = {"accelerator": "cpu", "enable_model_summary": False, **trainer_kwargs}
    if federated:
        model = FederatedDigitsClassifier()
        trainer = FederatedTrainer(  # FL (2/3): was `pl.Trainer(max_epochs=...)`
            algorithm=FedProx(mu=0.01), clients_per_round=10, local_epochs=2, max_epochs=max_epochs, seed=seed,
            **trainer_kwargs,
        )
        data = FederatedDataModule.from_datamodule(  # FL (3/3): was `DigitsDataModule()`
            DigitsDataModule(seed=seed), partitioner=Dirichlet(alpha=0.5), num_clients=20, seed=seed
        )
    else:
        model = DigitsClassifier()
        trainer = pl.Trainer(max_epochs=max_epochs, **trainer_kwargs)
        data = DigitsDataModule(seed=seed)
    trainer.fit(model, datamodule=data)
    return float(trainer.callback_metrics["val_acc"])


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--centralised", action="store_true", help="plain Lightning instead of FedProx")
    parser.add_argument("--max_epochs", type=int, default=40, help="epochs, or rounds when federated")
    args = parser.parse_args()
    # Tensors of a few thousand elements: more intra-op threads only add synchronisation.
    torch.set_num_threads(1)
    accuracy = main(federated=not args.centralised, max_epochs=args.max_epochs, logger=False, enable_checkpointing=False)
    print(f"final val_acc ({'centralised' if args.centralised else 'federated, FedProx'}): {accuracy:.4f}")
