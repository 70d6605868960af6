"""Pure functions from a run's per-round history to summary numbers and mean curves over seeds.

A *history* is a list of rows, one per round in round order, each ``{"round": r, <metric>: value,
...}`` with ``r`` the 0-based round index (the ``round`` column of the loggers' round rows).
"""

from __future__ import annotations

import csv
import importlib
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fl_lightning.utils.metric_names import MODES, require_logged

#: The loop's own metrics the study reads; it logs them in every round's row.
TOTAL_UPLOAD, TOTAL_DOWNLOAD = "round/total_upload_bytes", "round/total_download_bytes"
#: Asynchronous loops log these beside the round; a study plots against them when present.
VIRTUAL_TIME, MODEL_VERSION = "round/virtual_time", "round/version"

History = list[dict[str, float]]


def read_history(metrics_files: Iterable[Path]) -> History:
    """One row per round from Lightning ``CSVLogger`` files, oldest attempt first.

    A round logged by several attempts (a run resumed from its last checkpoint re-runs the
    round it was interrupted in) keeps the values of the latest attempt.
    """
    rounds: dict[int, dict[str, float]] = {}
    for path in metrics_files:
        attempt: dict[int, dict[str, float]] = {}
        with open(path, newline="") as file:
            for row in csv.DictReader(file):
                round_idx = _round_of(row)
                if round_idx is None:
                    continue
                values = attempt.setdefault(round_idx, {})
                values.update({k: float(v) for k, v in row.items() if k not in _AXES and v not in ("", None)})
        for step, values in attempt.items():
            rounds[step] = values
    return [{"round": float(step), **rounds[step]} for step in sorted(rounds)]


_AXES = ("step", "epoch", "round")


def _round_of(row: dict[str, str]) -> int | None:
    """The round a CSV row belongs to: its ``round`` column, else Lightning's ``epoch`` (one epoch
    is one round), else its ``step`` (files written before rows carried ``round``)."""
    for axis in ("round", "epoch", "step"):
        if row.get(axis):
            return int(float(row[axis]))
    return None


def metrics_files(csv_dir: Path) -> list[Path]:
    """``<csv_dir>/version_<n>/metrics.csv`` in attempt order."""

    def version(path: Path) -> int:
        match = re.fullmatch(r"version_(\d+)", path.parent.name)
        return int(match.group(1)) if match else -1

    return sorted(csv_dir.glob("version_*/metrics.csv"), key=version)


def series(history: History, key: str) -> np.ndarray:
    """The values of ``key`` over the rounds that logged it."""
    return np.asarray([row[key] for row in history if key in row], dtype=float)


def rounds_to_target(history: History, target: float, key: str, mode: str = "max") -> int | None:
    """Rounds run until ``key`` first reached ``target`` (1 if after the first round), or ``None``.

    Reached means ``>= target`` with ``mode="max"`` (an accuracy), ``<= target`` with ``"min"`` (a loss).

    Example:
        >>> rounds_to_target([{"round": 0, "val/acc": 0.5}, {"round": 1, "val/acc": 0.8}], 0.75, "val/acc")
        2
    """
    for row in history:
        if key in row and (row[key] >= target if mode == "max" else row[key] <= target):
            return int(row["round"]) + 1
    return None


def reduce(values: np.ndarray, reduction: str) -> float | None:
    """``final``, ``mean``, ``min``, ``max`` or ``sum`` of a per-round series (``None`` if empty)."""
    if values.size == 0:
        return None
    if reduction == "final":
        return float(values[-1])
    return float(getattr(np, reduction)(values))


def validation_keys(validation: Sequence[str], monitor: str | None) -> list[str]:
    """The summary keys of the validation metrics: ``final/`` and ``best/`` of the monitor, then ``final/`` of the others.

    Example:
        >>> validation_keys(["val/nll", "val/acc"], "val/acc")
        ['final/val/acc', 'best/val/acc', 'final/val/nll']
    """
    monitored = [f"final/{monitor}", f"best/{monitor}"] if monitor else []
    return monitored + [f"final/{name}" for name in validation if name != monitor]


def summarize_run(
    history: History,
    *,
    validation: Sequence[str] = (),
    monitor: str | None = None,
    mode: str = "max",
    target: float | None = None,
    metrics: Mapping[str, str] | Iterable[tuple[str, str]] = (),
) -> dict[str, float | None]:
    """A run's summary numbers: its validation metrics, rounds, bytes, extra metrics.

    Keys are :func:`validation_keys` (``final/<metric>`` of every validation metric, and
    ``best/<monitor>``: its minimum or maximum over rounds by ``mode``), ``rounds``,
    ``rounds_to_target`` (of ``monitor``), ``total_upload_bytes``, ``total_download_bytes``, and
    ``<reduction>/<metric>`` of the extra ``(metric, reduction)`` pairs (or mapping) ``metrics``.

    Raises:
        ValueError: ``monitor`` is in none of the rounds of a non-empty history (names the metrics that are).

    Example:
        >>> history = [{"round": 0, "val/acc": 0.5, "val/nll": 1.0}, {"round": 1, "val/acc": 0.4, "val/nll": 0.9}]
        >>> s = summarize_run(history, validation=["val/acc", "val/nll"], monitor="val/acc", target=0.5)
        >>> s["final/val/acc"], s["best/val/acc"], s["final/val/nll"], s["rounds_to_target"]
        (0.4, 0.5, 0.9, 1)
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {list(MODES)}, got {mode!r}.")
    if monitor is not None and history:
        require_logged(monitor, {key for row in history for key in row} - {"round"}, role="The monitored metric")
    summary: dict[str, float | None] = {}
    for key in validation_keys(validation, monitor):
        reduction, _, name = key.partition("/")
        summary[key] = reduce(series(history, name), "final" if reduction == "final" else mode)
    summary.update(
        {
            "rounds": float(len(history)),
            "rounds_to_target": None if target is None or monitor is None else rounds_to_target(history, target, monitor, mode),
            "total_upload_bytes": reduce(series(history, TOTAL_UPLOAD), "final"),
            "total_download_bytes": reduce(series(history, TOTAL_DOWNLOAD), "final"),
        }
    )
    for metric, reduction in metrics.items() if isinstance(metrics, Mapping) else metrics:
        summary[f"{reduction}/{metric}"] = reduce(series(history, metric), reduction)
    return summary


def mean_std(values: Iterable[float | None]) -> tuple[float, float, int]:
    """Mean, sample standard deviation (ddof = 1) and count of the finite values; NaN where undefined.

    Example:
        >>> mean_std([0.5, 0.7, None])
        (0.6, 0.14142135623730948, 2)
    """
    finite = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=float)
    if finite.size == 0:
        return math.nan, math.nan, 0
    std = float(finite.std(ddof=1)) if finite.size > 1 else math.nan
    return float(finite.mean()), std, int(finite.size)


def mean_curve(curves: Sequence[tuple[np.ndarray, np.ndarray]], points: int = 200) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean and standard deviation over seeds of ``y(x)`` curves.

    Curves that share their x values (e.g. rounds) are averaged point by point, over the
    rounds every curve has; others (bytes, virtual time) are interpolated onto a common grid
    over the x range that every curve covers.

    Returns:
        ``(x, mean, std)``; ``std`` is zero for a single curve.
    """
    curves = [(np.asarray(x, float), np.asarray(y, float)) for x, y in curves if len(x)]
    if not curves:
        return np.empty(0), np.empty(0), np.empty(0)
    shortest = min(len(x) for x, _ in curves)
    if all(np.array_equal(x[:shortest], curves[0][0][:shortest]) for x, _ in curves):
        grid = curves[0][0][:shortest]
        ys = np.stack([y[:shortest] for _, y in curves])
    else:
        low, high = max(x.min() for x, _ in curves), min(x.max() for x, _ in curves)
        grid = np.linspace(low, high, points) if high > low else np.asarray([low])
        ys = np.stack([np.interp(grid, x, y) for x, y in curves])
    std = ys.std(axis=0, ddof=1) if len(ys) > 1 else np.zeros(len(grid))
    return grid, ys.mean(axis=0), std


def byte_unit(value: float) -> tuple[float, str]:
    """The binary unit to print ``value`` bytes in, as ``(bytes per unit, name)``.

    Example:
        >>> byte_unit(3 * 1024**2)
        (1048576.0, 'MiB')
    """
    for power, unit in ((3, "GiB"), (2, "MiB"), (1, "KiB")):
        if abs(value) >= 1024**power:
            return 1024.0**power, unit
    return 1.0, "B"


def algorithm_metrics(class_path: str | None) -> dict[str, str]:
    """The round metrics an algorithm asks studies to report: its ``summary_metrics`` class attribute.

    An algorithm declares, e.g., ``summary_metrics = {"round/accepted_clients": "mean"}``
    (logged metric name -> reduction over rounds); unknown classes report nothing.
    """
    if not class_path or "." not in class_path:
        return {}
    module, _, name = class_path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return {}
    return dict(getattr(cls, "summary_metrics", None) or {})


def algorithm_class_path(config: Mapping[str, Any]) -> str | None:
    """``trainer.algorithm.class_path`` of a resolved ``fl-lightning`` config."""
    algorithm = (config.get("trainer") or {}).get("algorithm")
    return algorithm.get("class_path") if isinstance(algorithm, Mapping) else None
