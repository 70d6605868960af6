"""Records each client's mean training loss without a device sync per step."""

from __future__ import annotations

from array import array
from typing import Any

import lightning.pytorch as pl
from torch import Tensor
from typing_extensions import override

from fl_lightning.callbacks.federated_callback import FederatedCallback
from fl_lightning.algorithms.shared.algorithm import TRAINING_METRICS
from fl_lightning.mixins.regularized import split_losses
from fl_lightning.utils.scalars import read_scalars


class _Mean:
    """A client's per-step scalar tensors, averaged when read: one device sync per client and no tensor operation
    per step, in float32 arithmetic, as a running float32 sum on the device would give it."""

    def __init__(self) -> None:
        self.values: list[Tensor] = []

    def add(self, value: Tensor) -> None:
        self.values.append(value.detach())

    def pop(self) -> float | None:
        if not self.values:
            return None
        # Each value as a float32 (array "f" rounds as .float() does), summed in order and divided in float32: a sum or
        # quotient of float32 values computed in double precision and rounded once is the float32 result (53 bits
        # exceed 2 * 24 + 2), so this is the device's running float32 sum, without numpy's or torch's machinery.
        values, self.values = array("f", read_scalars(self.values)), []
        total = array("f", [0.0])
        for value in values:
            total[0] += value
        return array("f", [total[0] / len(values)])[0]


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
        if isinstance(output, Tensor):  # the task loss alone, every step of most modules: _Mean.add, one call fewer
            self._loss.values.append(output.detach())
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
