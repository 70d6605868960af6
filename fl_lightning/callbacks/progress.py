"""A Rich progress bar over rounds and the clients within the round; one plain line per round off a terminal."""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks.progress import ProgressBar
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Column
from typing_extensions import override

from fl_lightning.algorithms.shared.algorithm import ClientContext, ClientUpdate
from fl_lightning.callbacks.federated_callback import FederatedCallback
from fl_lightning.distributed.sharding import shard

#: The federated loop's own round metric: the mean of the round's client training losses.
TRAIN_LOSS = "round/train_loss"


class FederatedProgressBar(ProgressBar, FederatedCallback):
    """Two Rich bars: rounds done, and clients done in the current round, with the latest metrics.

    Off a terminal (a SLURM or CI log file), where a live bar would show only its last frame, it
    prints one plain line per round instead: rounds done, the metrics, time elapsed and the
    estimated time left (the mean round time of this run so far, times the rounds left)::

        rounds 12/40  val_loss=1.031  val_acc=0.7083  round/train_loss=0.9214  elapsed 0:00:05  eta 0:00:11

    Under an asynchronous algorithm (FedBuff, FedStaleWeight, FedAsync) a Lightning epoch is one
    aggregation, and the bar counts ``aggregations`` instead of ``rounds``. Under a DP mechanism the line
    ends with the privacy spent (:meth:`~fl_lightning.Algorithm.privacy_statement`), e.g.
    ``ε = 3.12 at δ = 1e-05 (PLD, add/remove-one)``; the round's mean training loss is then shown only
    when the mechanism logs client statistics (``log_client_statistics=True``).

    Installed by :class:`~fl_lightning.FederatedTrainer` unless ``enable_progress_bar=False`` or
    another progress bar is given.

    Args:
        metrics: the metrics to show, from ``trainer.callback_metrics`` and the round's metrics;
            by default every metric logged with ``prog_bar=True`` (Lightning's
            :meth:`get_metrics`) and the round's mean training loss.
        console: where to draw (default: standard output); bars on an interactive terminal or in
            Jupyter, plain lines otherwise.
    """

    def __init__(self, metrics: Sequence[str] | None = None, console: Console | None = None) -> None:
        super().__init__()
        self.metrics = None if metrics is None else tuple(metrics)
        self.console = console
        self._enabled = True
        self._progress: Progress | None = None
        self._rounds = self._clients = None
        self._lines: Console | None = None  # the console of the plain lines, while they are printed
        self._total: int | None = None
        self._done = self._first = 0
        self._started = 0.0
        self._unit = "rounds"

    @override
    def disable(self) -> None:
        self._enabled = False

    @override
    def enable(self) -> None:
        self._enabled = True

    @override
    def print(self, *args: Any, **kwargs: Any) -> None:
        (self._progress.console if self._progress else self.console or Console()).print(*args, **kwargs)

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not (self._enabled and trainer.is_global_zero):
            return
        console = self.console or Console()
        self._total = trainer.max_epochs if trainer.max_epochs and trainer.max_epochs > 0 else None
        self._done = self._first = trainer.current_epoch
        self._started = time.monotonic()
        # An asynchronous algorithm's Lightning epoch is one aggregation of buffered updates, not a round.
        self._unit = "aggregations" if getattr(getattr(trainer, "algorithm", None), "asynchronous", False) else "rounds"
        if not (console.is_interactive or console.is_jupyter):
            self._lines = console
            return
        # The counts and times never wrap or shrink; the metrics fold onto more lines instead, so
        # 80 columns still show "12/40" and "0:01:05" whole.
        fixed = Column(no_wrap=True)
        self._progress = Progress(
            TextColumn("[bold]{task.description}", table_column=Column(no_wrap=True, min_width=9)),
            BarColumn(bar_width=20, table_column=fixed),
            MofNCompleteColumn(table_column=fixed),
            TimeElapsedColumn(table_column=fixed),
            TextColumn("{task.fields[info]}", table_column=Column(overflow="fold")),
            console=console,
        )
        self._progress.start()
        self._rounds = self._progress.add_task(self._unit, total=self._total, completed=self._done, info="")
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
    def get_metrics(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> dict[str, int | str | float | dict[str, float]]:
        """Lightning's, without the logger's ``v_num``: not a metric, and the run's version is in its
        log directory, which the fit summary names."""
        metrics = super().get_metrics(trainer, pl_module)
        metrics.pop("v_num", None)
        return metrics

    @override
    def on_round_aggregated(self, trainer: pl.Trainer, pl_module: pl.LightningModule, round_idx: int, metrics: dict[str, float]) -> None:
        if self._progress is None and self._lines is None:
            return  # disabled, or not rank 0
        if self.metrics is None:
            values = {**self.get_metrics(trainer, pl_module), **{k: v for k, v in metrics.items() if k == TRAIN_LOSS}}
        else:
            available = {**trainer.callback_metrics, **metrics}
            values = {k: available[k] for k in self.metrics if k in available}
        info = "  ".join(f"{k}={_format(v)}" for k, v in values.items())
        algorithm = getattr(trainer, "algorithm", None)
        statement = algorithm.privacy_statement() if algorithm is not None else None
        if statement:
            info = f"{info}  {statement}" if info else statement
        self._done += 1
        if self._progress is not None:
            self._progress.update(self._rounds, advance=1, info=info)
        else:
            self._print_line(self._lines, info)

    def _print_line(self, console: Console, info: str) -> None:
        """``rounds <done>/<total>  <metrics>  elapsed <h:mm:ss>  eta <h:mm:ss>`` (``aggregations`` for an
        asynchronous algorithm), never wrapped."""
        elapsed = time.monotonic() - self._started
        total = "?" if self._total is None else str(self._total)
        parts = [f"{self._unit} {self._done}/{total}", info, f"elapsed {_clock(elapsed)}"]
        if self._total is not None:
            parts.append(f"eta {_clock(elapsed / (self._done - self._first) * (self._total - self._done))}")
        line = "  ".join(part for part in parts if part)
        # soft_wrap: a log file gets the whole line, however narrow the console thinks it is.
        console.print(line, soft_wrap=True, markup=False, highlight=False)
        console.file.flush()

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._stop()

    @override
    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self._stop()

    def _stop(self) -> None:
        self._lines = None
        if self._progress is not None:
            self._progress.stop()
            self._progress = None


def _clock(seconds: float) -> str:
    """``h:mm:ss``, as Rich's elapsed-time column shows it."""
    return str(timedelta(seconds=int(seconds)))


def _format(value: Any) -> str:
    # Lightning's standard metrics include the logger's version, which may be a string.
    try:
        return f"{float(value):.4g}"
    except (TypeError, ValueError):
        return str(value)
