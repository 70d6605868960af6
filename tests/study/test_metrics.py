"""Histories from CSV logs, run summaries, mean ± std over seeds, mean curves."""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest

from fl_lightning.study.metrics import (
    algorithm_class_path,
    algorithm_metrics,
    mean_curve,
    mean_std,
    metrics_files,
    read_history,
    rounds_to_target,
    summarize_run,
)


class ReportingAlgorithm:
    summary_metrics: ClassVar[dict[str, str]] = {"round/accepted_clients": "mean"}


def write_metrics(path: Path, rows: list[dict[str, float]]) -> Path:
    """Rows as Lightning's CSVLogger writes them: one column per metric, blanks elsewhere."""
    path.parent.mkdir(parents=True, exist_ok=True)
    keys = sorted({k for row in rows for k in row} | {"step", "epoch"})
    with open(path, "w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=keys)
        writer.writeheader()
        writer.writerows(rows)
    return path


def test_history_merges_a_rounds_rows_and_later_attempts_win(tmp_path):
    first = write_metrics(
        tmp_path / "csv" / "version_0" / "metrics.csv",
        [
            {"epoch": 0, "step": 0, "val_acc": 0.5},
            {"step": 0, "round/total_upload_bytes": 100},
            {"epoch": 1, "step": 1, "val_acc": 0.55},  # round 1 was cut short and re-run
        ],
    )
    second = write_metrics(
        tmp_path / "csv" / "version_1" / "metrics.csv",
        [{"epoch": 1, "step": 1, "val_acc": 0.6}, {"step": 1, "round/total_upload_bytes": 200}],
    )
    write_metrics(tmp_path / "csv" / "version_10" / "metrics.csv", [])
    files = metrics_files(tmp_path / "csv")
    assert [f.parent.name for f in files] == ["version_0", "version_1", "version_10"]
    assert read_history([first, second]) == [
        {"round": 0.0, "val_acc": 0.5, "round/total_upload_bytes": 100.0},
        {"round": 1.0, "val_acc": 0.6, "round/total_upload_bytes": 200.0},
    ]


def test_run_summary_reduces_every_series_under_the_modules_names():
    history = [
        {"round": 0.0, "val/acc": 0.4, "val/nll": 1.5, "round/total_upload_bytes": 10, "round/accepted": 3},
        {"round": 1.0, "val/acc": 0.7, "val/nll": 1.0, "round/total_upload_bytes": 20, "round/accepted": 5},
        {"round": 2.0, "val/acc": 0.6, "val/nll": 1.2, "round/total_upload_bytes": 30, "round/accepted": 4},
    ]
    summary = summarize_run(
        history,
        validation=["val/acc", "val/nll"],
        monitor="val/acc",
        mode="max",
        target=0.65,
        metrics={"round/accepted": "mean", "round/total_upload_bytes": "sum"},
    )
    assert summary == {
        "final/val/acc": 0.6,
        "best/val/acc": 0.7,
        "final/val/nll": 1.2,
        "rounds": 3.0,
        "rounds_to_target": 2,
        "total_upload_bytes": 30.0,
        "total_download_bytes": None,
        "mean/round/accepted": 4.0,
        "sum/round/total_upload_bytes": 60.0,
    }
    assert rounds_to_target(history, 0.9, "val/acc") is None
    # A loss improves downwards: best is the minimum, the target is reached from above.
    by_loss = summarize_run(history, validation=["val/acc", "val/nll"], monitor="val/nll", mode="min", target=1.1)
    assert (by_loss["best/val/nll"], by_loss["rounds_to_target"], by_loss["final/val/acc"]) == (1.0, 2, 0.6)
    # Without a monitor: every validation metric's final value, no best.
    assert summarize_run(history, validation=["val/nll"]).keys() >= {"final/val/nll"}
    assert "best/val/nll" not in summarize_run(history, validation=["val/nll"])
    assert summarize_run([], validation=["val/acc"], monitor="val/acc")["final/val/acc"] is None


def test_a_monitored_metric_that_was_never_logged_is_named_with_the_available_ones():
    history = [{"round": 0.0, "val/acc": 0.4, "round/clients": 2.0}]
    with pytest.raises(
        ValueError, match=r"monitored metric 'val_acc' was never logged; the logged metrics are \['round/clients', 'val/acc'\]"
    ):
        summarize_run(history, monitor="val_acc")
    with pytest.raises(ValueError, match=r"mode must be one of \['min', 'max'\], got 'up'"):
        summarize_run(history, monitor="val/acc", mode="up")


def test_mean_std_uses_the_sample_std_and_skips_missing_values():
    assert mean_std([1.0, 3.0]) == (2.0, math.sqrt(2), 2)
    mean, std, n = mean_std([5.0, None, math.nan])
    assert (mean, n) == (5.0, 1) and math.isnan(std)
    assert all(math.isnan(v) for v in mean_std([])[:2])


def test_mean_curve_averages_shared_rounds_and_interpolates_other_axes():
    x, mean, std = mean_curve([(np.array([1, 2, 3]), np.array([0.1, 0.2, 0.3])), (np.array([1, 2]), np.array([0.3, 0.4]))])
    np.testing.assert_allclose(x, [1, 2])
    np.testing.assert_allclose(mean, [0.2, 0.3])
    np.testing.assert_allclose(std, [np.sqrt(0.02)] * 2)
    # Different x (bytes, virtual time): a common grid over the range both cover.
    x, mean, _ = mean_curve(
        [(np.array([0.0, 2.0]), np.array([0.0, 2.0])), (np.array([1.0, 3.0]), np.array([1.0, 3.0]))], points=3
    )
    np.testing.assert_allclose(x, [1.0, 1.5, 2.0])
    np.testing.assert_allclose(mean, [1.0, 1.5, 2.0])
    x, mean, std = mean_curve([(np.array([1.0]), np.array([0.5]))])
    assert (list(x), list(mean), list(std)) == ([1.0], [0.5], [0.0])


def test_an_algorithm_declares_its_summary_columns():
    path = f"{__name__}.ReportingAlgorithm"
    assert algorithm_metrics(path) == {"round/accepted_clients": "mean"}
    assert algorithm_metrics("fl_lightning.FedAvg") == {}
    assert algorithm_metrics("no.such.Module") == algorithm_metrics(None) == {}
    assert algorithm_class_path({"trainer": {"algorithm": {"class_path": path}}}) == path
    assert algorithm_class_path({"trainer": {"algorithm": None}}) is None


@pytest.mark.parametrize(("value", "unit"), [(10, "B"), (2048, "KiB"), (3 * 1024**3, "GiB")])
def test_byte_units(value, unit):
    from fl_lightning.study.metrics import byte_unit

    assert byte_unit(value)[1] == unit
