"""The per-client table of an evaluation round: a ``wandb.Table`` for loggers that take tables,
else rows appended to a CSV file in the first logger's directory."""

from __future__ import annotations

import csv
import os
from collections.abc import Mapping, Sequence
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from lightning.pytorch.utilities.rank_zero import rank_zero_warn

from fl_lightning.evaluation.results import ClientEvaluation

#: Columns of every table; ``acc`` and the personal columns only when some row has them.
BASE_COLUMNS = ("round", "client", "group", "n", "loss")
_COLUMN_OF = {"accuracy": "acc", "personal_loss": "personal_loss", "personal_accuracy": "personal_acc"}


def table_rows(
    round_idx: int, results: Sequence[ClientEvaluation], groups: Mapping[str, Sequence[int]], *, personal: bool
) -> tuple[list[str], list[list[Any]]]:
    """Columns and one row per client: round, client, group (its groups joined by ``+``, or
    empty), n, loss[, acc][, personal_loss, personal_acc]. ``acc`` is there when the module
    reports accuracy, the personal columns with ``personal`` (a client without its own model yet
    has ``None`` there), so the columns do not change from round to round."""
    accuracy = any(r.accuracy is not None for r in results)
    fields = ["accuracy"] * accuracy + ["personal_loss"] * personal + ["personal_accuracy"] * (personal and accuracy)
    columns = [*BASE_COLUMNS, *(_COLUMN_OF[f] for f in fields)]
    member_sets = {name: set(members) for name, members in groups.items()}
    rows = [
        [
            round_idx,
            r.client_id,
            "+".join(name for name, members in member_sets.items() if r.client_id in members),
            r.num_samples,
            r.loss,
            *(getattr(r, f) for f in fields),
        ]
        for r in results
    ]
    return columns, rows


class ClientTable:
    """Sends the rows of each evaluation round to the trainer's loggers (call on rank 0).

    A logger with ``log_table`` (``WandbLogger``) gets the round's table under ``key``. When none
    does, the rows are appended to ``filename`` in the first logger's directory (``log_dir`` of
    a CSV or TensorBoard logger, else ``save_dir``); a file that already exists there when the
    run first writes is kept, and the rows go to ``<name>-1.csv`` (``-2``, ...) instead, with a
    warning. Without loggers nothing is written.
    """

    def __init__(self, key: str = "clients/table", filename: str = "federated_evaluation.csv") -> None:
        if not filename.endswith(".csv"):
            raise ValueError(f"The table's `filename` must end in '.csv', got {filename!r}.")
        self.key, self.filename = key, filename
        #: The CSV file this run writes (``None`` until the first write).
        self.path: str | None = None

    def reset(self) -> None:
        """Forgets the file, so the next run picks (and checks) its own."""
        self.path = None

    def send(self, trainer: pl.Trainer, columns: list[str], rows: list[list[Any]], step: int) -> None:
        table_loggers = [logger for logger in trainer.loggers if callable(getattr(logger, "log_table", None))]
        for logger in table_loggers:
            logger.log_table(key=self.key, columns=columns, data=rows, step=step)  # type: ignore[attr-defined]
        if table_loggers or not trainer.loggers:
            return
        if self.path is None:
            self.path = self._free_path(self._directory(trainer))
            with open(self.path, "w", newline="") as f:
                csv.writer(f).writerow(columns)
        with open(self.path, "a", newline="") as f:
            csv.writer(f).writerows(["" if v is None else v for v in row] for row in rows)

    @staticmethod
    def _directory(trainer: pl.Trainer) -> str:
        # Not `trainer.log_dir`: it broadcasts, and this runs on rank 0 only.
        logger = trainer.loggers[0]
        directory = logger.log_dir if isinstance(logger, (CSVLogger, TensorBoardLogger)) else logger.save_dir
        directory = directory or trainer.default_root_dir
        os.makedirs(directory, exist_ok=True)
        return directory

    def _free_path(self, directory: str) -> str:
        stem = self.filename[: -len(".csv")]
        path, suffix = os.path.join(directory, self.filename), 0
        while os.path.exists(path):
            suffix += 1
            path = os.path.join(directory, f"{stem}-{suffix}.csv")
        if suffix:
            rank_zero_warn(f"{os.path.join(directory, self.filename)} exists and is kept; the per-client table goes to {path}.")
        return path
