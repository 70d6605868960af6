"""The callbacks a study adds to each run: ``CompletionMarker`` and ``WandbRunSummary``."""

from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import WandbLogger
from typing_extensions import override

from fl_lightning.callbacks.federated_callback import FederatedCallback
from fl_lightning.study.metrics import MODEL_VERSION, VIRTUAL_TIME, History, summarize_run
from fl_lightning.utils.metric_names import logged_validation_metrics, monitored_metrics

#: The step key Lightning's ``WandbLogger`` writes; the federated loop logs with the round as step.
ROUND_AXIS = "trainer/global_step"


class CompletionMarker(Callback):
    """Writes ``path`` when ``fit`` ends normally: the evidence that a run finished.

    An exit status of 0 is not: Lightning stops gracefully, and exits 0, on SIGTERM. The
    marker also records the metric names the study reports: what the module logged in
    validation and what the run's ``ModelCheckpoint``/``EarlyStopping`` monitor.

    Args:
        path: the marker file (JSON: when, the rounds run, ``validation_metrics``, ``monitors``: name -> mode).
    """

    def __init__(self, path: str) -> None:
        self.path = Path(path)

    @override
    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if getattr(trainer, "received_sigterm", False) or trainer.interrupted:
            return
        marker = {
            "finished": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "rounds": trainer.current_epoch,
            "validation_metrics": logged_validation_metrics(trainer),
            "monitors": monitored_metrics(trainer),
        }
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(marker))
        os.replace(tmp, self.path)


class WandbRunSummary(FederatedCallback):
    """Declares the x-axes of every :class:`~lightning.pytorch.loggers.WandbLogger` run and, when
    ``fit`` ends, writes :func:`~fl_lightning.study.metrics.summarize_run` into its summary.

    Every metric is plotted against the round (``trainer/global_step``) by default; virtual
    time and model version, which asynchronous loops log every round, are declared as
    metrics of their own (pick them as the x-axis of a W&B chart), with their maximum in
    the summary. The summary gets :func:`~fl_lightning.study.metrics.summarize_run`'s keys:
    ``final/<metric>`` of every metric the module logged in validation, ``best/<monitor>``,
    ``rounds_to_target``, the byte totals and ``<reduction>/<metric>`` for the study's extra
    metrics and the algorithm's ``summary_metrics``. The per-round history is checkpointed, so a
    resumed run's summary covers all its rounds.

    Args:
        monitor: the metric behind ``best/`` and ``rounds_to_target`` (default: the trainer's
            ``ModelCheckpoint``/``EarlyStopping`` monitor, if any).
        mode: ``"max"`` or ``"min"``: how ``monitor`` improves (default ``"max"``, or the monitoring callback's).
        target_accuracy: the threshold of ``monitor`` for ``rounds_to_target``.
        metrics: extra round metrics to summarise: name -> reduction (``final``, ``mean``, ...).
    """

    def __init__(
        self,
        monitor: str | None = None,
        mode: str | None = None,
        target_accuracy: float | None = None,
        metrics: dict[str, str] | None = None,
    ) -> None:
        self.monitor, self.mode = monitor, mode
        self.target_accuracy = target_accuracy
        self.metrics = dict(metrics or {})
        self.history: History = []

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        for run in _wandb_runs(trainer):
            run.define_metric(ROUND_AXIS)
            run.define_metric("*", step_metric=ROUND_AXIS, step_sync=True)
            # Alternative x-axes of asynchronous runs; "max" puts their totals in the summary.
            for axis in (VIRTUAL_TIME, MODEL_VERSION):
                run.define_metric(axis, step_metric=ROUND_AXIS, step_sync=True, summary="max")

    @override
    def on_round_aggregated(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, round_idx: int, metrics: dict[str, float]
    ) -> None:
        row = {"round": float(round_idx), **{k: float(v) for k, v in metrics.items()}}
        logged = trainer.callback_metrics
        for key in [*logged_validation_metrics(trainer), *monitored_metrics(trainer), *filter(None, [self.monitor])]:
            if key in logged:
                row[key] = float(logged[key])
        # A round re-run after a mid-round resume replaces its earlier record.
        self.history = [r for r in self.history if r["round"] < round_idx] + [row]

    @override
    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        algorithm = getattr(trainer, "algorithm", None)
        metrics = [*dict(getattr(type(algorithm), "summary_metrics", None) or {}).items(), *self.metrics.items()]
        monitors = monitored_metrics(trainer)
        monitor = self.monitor or next(iter(monitors), None)
        summary = summarize_run(
            self.history,
            validation=logged_validation_metrics(trainer),
            monitor=monitor,
            mode=self.mode or monitors.get(monitor or "", "max"),
            target=self.target_accuracy,
            metrics=metrics,
        )
        summary = {k: v for k, v in summary.items() if v is not None}
        for run in _wandb_runs(trainer):
            run.summary.update(summary)

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"history": [dict(row) for row in self.history]}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.history = [dict(row) for row in state_dict.get("history", [])]


def _wandb_runs(trainer: pl.Trainer) -> list[Any]:
    return [logger.experiment for logger in trainer.loggers if isinstance(logger, WandbLogger)]
