"""Records each client's mean training loss without a device sync per step."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
from torch import Tensor
from typing_extensions import override

from fl_lightning.callbacks.federated_callback import FederatedCallback
from fl_lightning.algorithms.shared.algorithm import TRAINING_METRICS
from fl_lightning.mixins.regularized import split_losses


class _Mean:
    """A running sum of scalar tensors, read once (no device sync per step)."""

    def __init__(self) -> None:
        self.sum: Tensor | None = None
        self.count = 0

    def add(self, value: Tensor) -> None:
        value = value.detach().float()
        self.sum = value if self.sum is None else self.sum + value
        self.count += 1

    def pop(self) -> float | None:
        mean = None if self.sum is None else float(self.sum / self.count)
        self.sum, self.count = None, 0
        return mean


class ClientLossRecorder(FederatedCallback):
    """Accumulates the task loss (and any regulariser a mixin added, kept apart:
    :mod:`fl_lightning.mixins.regularized`) that ``training_step`` returns over a client's steps.

    Installed by the federated fit loop (``loop.loss_recorder``); its client executors read :meth:`pop_means`.
    """

    def __init__(self) -> None:
        self._loss = _Mean()
        self._regularizer = _Mean()

    @override
    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.record(outputs)

    def record(self, output: Any) -> None:
        """Adds one step's ``training_step`` output (a loss tensor or a dict with ``"loss"``)."""
        if isinstance(output, Tensor):  # the task loss alone, every step of most modules
            self._loss.add(output)
            return
        loss, regularizer = split_losses(output)
        if loss is not None:
            self._loss.add(loss)
        if regularizer is not None:
            self._regularizer.add(regularizer)

    def pop_means(self) -> dict[str, float]:
        """``train_loss`` (the task loss) and ``train_regularizer`` averaged over the steps since
        the last call (a key is absent if no step reported it), and resets."""
        means = dict(zip(TRAINING_METRICS, (self._loss.pop(), self._regularizer.pop())))
        return {k: v for k, v in means.items() if v is not None}
