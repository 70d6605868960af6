"""A logger that keeps what it is sent, for tests that check what reaches the loggers."""

from __future__ import annotations

from typing import Any

from lightning.pytorch.loggers import Logger


class RecordingLogger(Logger):
    """Records every ``log_metrics`` call as ``(step, metrics)``, every ``log_table`` call
    (a logger that takes tables, like ``WandbLogger``) and the hyper-parameters it was sent."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[tuple[int | None, dict[str, float]]] = []
        self.tables: list[dict[str, Any]] = []
        self.hyperparameters: dict[str, Any] = {}

    @property
    def name(self) -> str:
        return "recording"

    @property
    def version(self) -> int:
        return 0

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        self.hyperparameters.update(params)

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.records.append((step, dict(metrics)))

    def log_table(self, key: str, columns: list[str], data: list[list[Any]], step: int | None = None) -> None:
        self.tables.append({"key": key, "columns": columns, "data": data, "step": step})

    def steps(self, key: str) -> list[int | None]:
        """The step of every ``log_metrics`` call that had ``key``."""
        return [step for step, metrics in self.records if key in metrics]
