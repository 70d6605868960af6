"""A character-level language model (Embedding + GRU), written as a plain Lightning project, federated.

The project: each sample is one line of a standard-library module's docstring (no download), as
character ids; its datamodule pads a batch of lines to one length in its own ``collate_fn`` and
returns dict batches; the model logs ``val/char_acc`` and ``val/ppl``. Everything the datamodule
needs it reads from ``self.hparams``. Federating it takes the ``Federated`` wrapper and
``FederatedTrainer`` in :func:`main`, or the YAML beside this file::

    python examples/char_gru.py                         # Python API, FedAvg, 20 rounds
    cd examples && fl-lightning fit --config char_gru.yaml

The walkthrough, with what each printed, is ``docs/walkthrough_sequence_model.md``.
"""

from __future__ import annotations

import importlib
from typing import Any

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import DataLoader
from torchmetrics.classification import MulticlassAccuracy
from torchmetrics.text import Perplexity

from fl_lightning import FedAvg, FederatedTrainer
from fl_lightning.algorithms import Algorithm
from fl_lightning.data import Federated

#: Character ids are code points below 128; 0 (NUL, never in a docstring) pads.
VOCAB, PAD = 128, 0

# --------------------------------------------------------------------------------------
# The project: nothing federated above `main`.
# --------------------------------------------------------------------------------------


def encode(line: str) -> Tensor:
    return torch.tensor([min(ord(c), VOCAB - 1) for c in line])


def pad_batch(lines: list[Tensor]) -> dict[str, Tensor]:
    """Lines of different lengths as ``{"input", "target"}``: each character predicts the next, padding ignored."""
    padded = pad_sequence(lines, batch_first=True, padding_value=PAD)
    return {"input": padded[:, :-1], "target": padded[:, 1:]}


class DocstringLines(pl.LightningDataModule):
    """The non-empty docstring lines of ``modules``, cut to ``seq_len`` characters; every ``val_every``-th
    line is validation."""

    def __init__(self, modules: tuple[str, ...] = ("argparse", "json", "csv", "unittest", "logging"),
                 seq_len: int = 64, batch_size: int = 16, val_every: int = 10) -> None:
        super().__init__()
        self.save_hyperparameters()

    def setup(self, stage: str | None = None) -> None:
        text = "\n".join(importlib.import_module(name).__doc__ or "" for name in self.hparams.modules)
        lines = [encode(line.strip()[: self.hparams.seq_len]) for line in text.splitlines() if len(line.strip()) > 1]
        self.train = [line for i, line in enumerate(lines) if i % self.hparams.val_every]
        self.val = lines[:: self.hparams.val_every]

    def train_dataloader(self) -> DataLoader[Any]:
        return DataLoader(self.train, batch_size=self.hparams.batch_size, shuffle=True, collate_fn=pad_batch)

    def val_dataloader(self) -> DataLoader[Any]:
        return DataLoader(self.val, batch_size=self.hparams.batch_size, collate_fn=pad_batch)


class CharGRU(pl.LightningModule):
    """Embedding, one GRU layer, a linear head over the next character."""

    def __init__(self, embedding_dim: int = 32, hidden: int = 64, lr: float = 3e-3) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.embedding = nn.Embedding(VOCAB, embedding_dim, padding_idx=PAD)
        self.gru = nn.GRU(embedding_dim, hidden, batch_first=True)
        self.head = nn.Linear(hidden, VOCAB)
        self.char_acc = MulticlassAccuracy(VOCAB, average="micro", ignore_index=PAD)
        self.ppl = Perplexity(ignore_index=PAD)

    def forward(self, ids: Tensor) -> Tensor:
        return self.head(self.gru(self.embedding(ids))[0])

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        logits = self(batch["input"])
        loss = F.cross_entropy(logits.flatten(0, 1), batch["target"].flatten(), ignore_index=PAD)
        self.log("train/loss", loss, on_step=False, on_epoch=True, batch_size=len(logits))
        return loss

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        logits = self(batch["input"])
        self.char_acc(logits.flatten(0, 1), batch["target"].flatten())
        self.ppl(logits, batch["target"])
        self.log_dict({"val/char_acc": self.char_acc, "val/ppl": self.ppl}, batch_size=len(logits))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)


# --------------------------------------------------------------------------------------
# Federated: 8 clients (an IID split of the lines), 4 per round.
# --------------------------------------------------------------------------------------


def main(rounds: int = 20, algorithm: Algorithm | None = None, model: pl.LightningModule | None = None,
         **trainer_kwargs: Any) -> dict[str, float]:
    """Trains :class:`CharGRU` federated for ``rounds`` rounds; returns the final validation metrics."""
    data = Federated(DocstringLines(), num_clients=8, seed=0)
    trainer = FederatedTrainer(algorithm=algorithm or FedAvg(), clients_per_round=4, max_epochs=rounds, **trainer_kwargs)
    trainer.fit(model or CharGRU(), datamodule=data)
    return {name: float(value) for name, value in trainer.callback_metrics.items() if name.startswith("val/")}


if __name__ == "__main__":
    pl.seed_everything(0)
    print(main())
