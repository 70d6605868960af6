"""A reusable classification LightningModule: cross-entropy, torchmetrics accuracy, SGD."""

from __future__ import annotations

from typing import Any, Literal

import lightning.pytorch as pl
import torch
from lightning.pytorch.cli import LRSchedulerCallable
import torch.nn.functional as F
from torch import Tensor, nn
from torchmetrics.classification import MulticlassAccuracy
from fl_lightning.utils.checks import check_integer, non_negative, positive


class ClassificationModule(pl.LightningModule):
    """Base for classifiers: subclasses build ``self.net``; batches are ``(x, y)``.

    Logs ``val_loss``/``val_acc`` (server evaluation of the global model each round) and
    ``test_loss``/``test_acc``. The training loss is not logged per step: the federated loop
    already logs ``round/train_loss`` from the loss ``training_step`` returns, and Lightning's
    ``self.log`` would add ~0.45 ms to every local step (``benchmarks/RESULTS.md``).

    Args:
        num_classes: number of classes.
        lr: local learning rate.
        momentum: SGD momentum (0 = plain SGD, as in most FL papers).
        weight_decay: L2 penalty.
        optimizer: ``"sgd"`` or ``"adam"``.
        lr_scheduler: a scheduler factory (e.g. ``StaircaseLR``, or any ``torch`` scheduler class with its
            arguments bound), stepped once per round.
    """

    def __init__(
        self,
        *,
        num_classes: int,
        lr: float = 0.05,
        momentum: float = 0.0,
        weight_decay: float = 0.0,
        optimizer: Literal["sgd", "adam"] = "sgd",
        lr_scheduler: LRSchedulerCallable | None = None,
    ) -> None:
        super().__init__()
        check_integer("num_classes", num_classes, minimum=2)
        positive("lr", lr)
        non_negative("momentum", momentum)
        non_negative("weight_decay", weight_decay)
        if optimizer not in ("sgd", "adam"):
            raise ValueError(f"`optimizer` must be 'sgd' or 'adam', got {optimizer!r}.")
        self.num_classes, self.lr, self.momentum = num_classes, lr, momentum
        self.weight_decay, self.optimizer_name = weight_decay, optimizer
        self.lr_scheduler_factory = lr_scheduler
        # Called here, not in subclasses: Lightning then collects the arguments of every
        # __init__ in the chain, so inherited defaults (lr, momentum, ...) are recorded too.
        self.save_hyperparameters(ignore=["lr_scheduler"])
        self.val_acc = MulticlassAccuracy(num_classes=num_classes, average="micro")
        self.test_acc = MulticlassAccuracy(num_classes=num_classes, average="micro")
        self.net: nn.Module = nn.Identity()

    def setup(self, stage: str) -> None:
        """Refuses a datamodule that declares another class count (the natural-partition sources do):
        a mismatch would train, or count a next-token accuracy's special tokens, silently wrong."""
        super().setup(stage)
        try:
            datamodule = self.trainer.datamodule
        except RuntimeError:  # set up by hand, outside a Trainer: no data to compare with
            return
        declared = getattr(datamodule, "num_classes", None)
        if isinstance(declared, int) and declared != self.num_classes:
            raise ValueError(
                f"{type(self).__name__} predicts {self.num_classes} classes (token ids) but {type(datamodule).__name__} "
                f"has {declared}: set the model's size to the data's (num_classes, or vocab_size for a language model)."
            )

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        x, y = batch
        return F.cross_entropy(self(x), y)

    def sample_metrics(self, batch: tuple[Tensor, Tensor]) -> dict[str, Tensor]:
        """Per-sample cross-entropy and correctness, for loss probes (:mod:`fl_lightning.evaluation.probe`)."""
        x, y = batch
        logits = self(x)
        return {"loss": F.cross_entropy(logits, y, reduction="none"), "correct": (logits.argmax(-1) == y).float()}

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._evaluate(batch, "val", self.val_acc)

    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._evaluate(batch, "test", self.test_acc)

    def _evaluate(self, batch: tuple[Tensor, Tensor], stage: str, accuracy: MulticlassAccuracy) -> None:
        x, y = batch
        logits = self(x)
        accuracy(logits, y)
        self.log(f"{stage}_loss", F.cross_entropy(logits, y), batch_size=len(y), prog_bar=True)
        self.log(f"{stage}_acc", accuracy, batch_size=len(y), prog_bar=True)

    def configure_optimizers(self) -> Any:
        if self.optimizer_name == "adam":
            optimizer = torch.optim.Adam(self.parameters(), lr=self.lr, weight_decay=self.weight_decay)
        else:
            optimizer = torch.optim.SGD(
                self.parameters(), lr=self.lr, momentum=self.momentum, weight_decay=self.weight_decay
            )
        if self.lr_scheduler_factory is None:
            return optimizer
        scheduler = self.lr_scheduler_factory(optimizer)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "epoch"}}
