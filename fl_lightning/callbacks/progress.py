"""A Rich progress bar over rounds and the clients within the round."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks.progress import ProgressBar
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from typing_extensions import override

from fl_lightning.algorithms.shared.base import ClientContext, ClientUpdate
from fl_lightning.callbacks.federated_callback import FederatedCallback
from fl_lightning.distributed.sharding import shard

#: The federated loop's own round metric: the mean of the round's client training losses.
TRAIN_LOSS = "round/train_loss"


class FederatedProgressBar(ProgressBar, FederatedCallback):
    """Two Rich bars: rounds done, and clients done in the current round, with the latest metrics.

    Installed by :class:`~fl_lightning.FederatedTrainer` unless ``enable_progress_bar=False`` or
    another progress bar is given.

    Args:
        metrics: the metrics to show, from ``trainer.callback_metrics`` and the round's metrics;
            by default every metric logged with ``prog_bar=True`` (Lightning's
            :meth:`get_metrics`) and the round's mean training loss.
    """

    def __init__(self, metrics: Sequence[str] | None = None) -> None:
        super().__init__()
        self.metrics = None if metrics is None else tuple(metrics)
        self._enabled = True
        self._progress: Progress | None = None
        self._rounds = self._clients = None

    @override
    def disable(self) -> None:
        self._enabled = False

    @override
    def enable(self) -> None:
        self._enabled = True

    @override
    def print(self, *args: Any, **kwargs: Any) -> None:
        (self._progress.console if self._progress else Console()).print(*args, **kwargs)

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not (self._enabled and trainer.is_global_zero):
            return
        self._progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[info]}"),
        )
        self._progress.start()
        total = trainer.max_epochs if trainer.max_epochs and trainer.max_epochs > 0 else None
        self._rounds = self._progress.add_task("rounds", total=total, completed=trainer.current_epoch, info="")
        self._clients = self._progress.add_task("clients", total=None, info="")

    @override
    def on_clients_selected(self, trainer: pl.Trainer, pl_module: pl.LightningModule, round_idx: int, client_ids: list[int]) -> None:
        if self._progress is not None:
            # With several processes, this rank's share (rank 0 shows its bar).
            mine = shard(client_ids, trainer.global_rank, trainer.world_size)
            self._progress.reset(self._clients, total=len(mine), description=f"round {round_idx}")

    @override
    def on_client_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, client: ClientContext, update: ClientUpdate) -> None:
        if self._progress is not None:
            self._progress.advance(self._clients)

    @override
    def on_round_aggregated(self, trainer: pl.Trainer, pl_module: pl.LightningModule, round_idx: int, metrics: dict[str, float]) -> None:
        if self._progress is None:
            return
        if self.metrics is None:
            values = {**self.get_metrics(trainer, pl_module), **{k: v for k, v in metrics.items() if k == TRAIN_LOSS}}
        else:
            available = {**trainer.callback_metrics, **metrics}
            values = {k: available[k] for k in self.metrics if k in available}
        info = "  ".join(f"{k}={_format(v)}" for k, v in values.items())
        self._progress.update(self._rounds, advance=1, info=info)

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._stop()

    @override
    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self._stop()

    def _stop(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None


def _format(value: Any) -> str:
    # Lightning's standard metrics include the logger's version, which may be a string.
    try:
        return f"{float(value):.4g}"
    except (TypeError, ValueError):
        return str(value)
