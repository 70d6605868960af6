"""Records each client's mean training loss without a device sync per step."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
from torch import Tensor
from typing_extensions import override

from fl_lightning.callbacks.federated_callback import FederatedCallback


class ClientLossRecorder(FederatedCallback):
    """Accumulates the loss returned by ``training_step`` over a client's steps.

    Installed by :class:`~fl_lightning.FederatedTrainer`; the loop reads :meth:`pop_mean`.
    """

    def __init__(self) -> None:
        self._sum: Tensor | None = None
        self._count = 0

    @override
    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int) -> None:
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if isinstance(loss, Tensor):
            self.record(loss)

    def record(self, loss: Tensor) -> None:
        """Adds one step's loss (no device sync)."""
        loss = loss.detach().float()
        self._sum = loss if self._sum is None else self._sum + loss
        self._count += 1

    def pop_mean(self) -> float | None:
        """The mean loss since the last call (``None`` if no step ran), and resets."""
        mean = None if self._sum is None else float(self._sum / self._count)
        self._sum, self._count = None, 0
        return mean
