"""The round's row: every round-level metric of one round, logged once, with a ``round`` column.

Two step axes coexist in every logger:

* per-step metrics (``self.log(on_step=True)``) are logged by Lightning against its step
  counter, the optimizer steps taken over all clients so far, every ``log_every_n_steps``;
* round-level metrics (``round/*``, validation, an algorithm's own) are logged together in one
  row per round, at the index of the round's last optimizer step (Lightning's convention for
  epoch-end metrics, so steps only grow down a CSV file), with ``round`` in the row. W&B plots
  them against ``round`` (``define_metric(key, step_metric="round")``).
"""

from __future__ import annotations

from collections.abc import Mapping
from weakref import WeakKeyDictionary

import lightning.pytorch as pl
from lightning.pytorch.loggers import Logger, WandbLogger

from fl_lightning import _lightning_compat as compat

#: The column that holds the round index in every round-level row.
ROUND = "round"

#: The loop's round metrics that are unnoised functions of the clients' data or of who took part: the mean
#: training loss (and regulariser), the counts of updates received, aggregated, dropped and rejected, and the
#: bytes moved (a count of the sampled clients). A DP run leaves them out of the row unless its mechanism's
#: ``log_client_statistics`` (:attr:`~fl_lightning.Algorithm.hides_client_statistics`).
CLIENT_STATISTICS = frozenset({
    "round/train_loss",
    "round/train_regularizer",
    "round/clients",
    "round/aggregated_clients",
    "round/dropped_clients",
    "round/rejected_clients",
    "round/upload_bytes",
    "round/total_upload_bytes",
    "round/download_bytes",
    "round/total_download_bytes",
})

# Keys already given W&B's round axis, per logger (define_metric once per key).
_ROUND_AXIS_KEYS: WeakKeyDictionary[Logger, set[str]] = WeakKeyDictionary()


def log_round(trainer: pl.Trainer, round_idx: int, metrics: Mapping[str, float]) -> dict[str, float]:
    """Logs ``metrics`` and ``round`` as one row to every logger; returns the row."""
    row = {**metrics, ROUND: float(round_idx)}
    for logger in trainer.loggers:
        if isinstance(logger, WandbLogger):
            _use_round_axis(logger, row)
    compat.log_metrics(trainer, row, step=compat.epoch_end_log_step(trainer))
    return row


def without_client_statistics(metrics: Mapping[str, float]) -> dict[str, float]:
    """``metrics`` without the :data:`CLIENT_STATISTICS`."""
    return {key: value for key, value in metrics.items() if key not in CLIENT_STATISTICS}


def _use_round_axis(logger: WandbLogger, row: Mapping[str, float]) -> None:
    defined = _ROUND_AXIS_KEYS.setdefault(logger, set())
    new = [key for key in row if key not in defined]
    if not new:
        return
    experiment = logger.experiment
    if ROUND not in defined:
        experiment.define_metric(ROUND)
        defined.add(ROUND)
    for key in new:
        if key != ROUND:
            experiment.define_metric(key, step_metric=ROUND)
            defined.add(key)
