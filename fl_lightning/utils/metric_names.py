"""The user's metric names: what their callbacks monitor and what their module logs in evaluation.

Reports (the CLI's fit summary, studies) read these instead of assuming names such as ``val_acc``.
"""

from __future__ import annotations

from collections.abc import Iterable

import lightning.pytorch as pl
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint

from fl_lightning import _lightning_compat as compat

#: How a monitored metric improves, as in Lightning's ``ModelCheckpoint``/``EarlyStopping``.
MODES = ("min", "max")


def monitored_metrics(trainer: pl.Trainer) -> dict[str, str]:
    """Metric -> mode (``"min"``/``"max"``) of every ``ModelCheckpoint`` and ``EarlyStopping`` monitor, in callback order."""
    monitors: dict[str, str] = {}
    for callback in trainer.callbacks:  # type: ignore[attr-defined]
        if isinstance(callback, (ModelCheckpoint, EarlyStopping)) and callback.monitor is not None:
            monitors.setdefault(callback.monitor, callback.mode)
    return monitors


def logged_validation_metrics(trainer: pl.Trainer) -> list[str]:
    """Every metric the module logged during ``fit``'s validation."""
    return compat.evaluation_metric_names(trainer, "validate")


def logged_test_metrics(trainer: pl.Trainer) -> list[str]:
    """Every metric the module logged in its test loop (e.g. through :class:`~fl_lightning.callbacks.TestCurve`)."""
    return compat.evaluation_metric_names(trainer, "test")


def require_logged(metric: str, available: Iterable[str], *, role: str) -> None:
    """Raises ``ValueError`` naming ``metric`` and listing ``available`` unless it is among them.

    Args:
        metric: The metric a report needs.
        available: The metrics that were logged.
        role: What asked for it, for the message (e.g. ``"the study's monitor"``).
    """
    available = sorted(set(available))
    if metric not in available:
        raise ValueError(
            f"{role} {metric!r} was never logged; the logged metrics are {available}. "
            "Use one of them (the name your LightningModule passes to self.log)."
        )
