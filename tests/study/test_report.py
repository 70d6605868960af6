"""Summary tables and plots from runs' files, without running anything."""

from __future__ import annotations

import csv
import json
import math
import sys
from pathlib import Path

import pytest
import yaml

from fl_lightning.study.metrics import VIRTUAL_TIME
from fl_lightning.study.plots import draw, plot_specs, require_matplotlib, write_plots
from fl_lightning.study.report import collect, columns, write_tables
from fl_lightning.study.runner import DONE, FAILED, RunState, plan
from fl_lightning.study.spec import study_from_dict

from .test_metrics import write_metrics

ACCURACY = {  # (arm, seed) -> val/acc per round (the module's own name)
    ("a", 0): [0.2, 0.5, 0.6],
    ("a", 1): [0.3, 0.4, 0.8],
    ("b", 0): [0.1, 0.2, 0.3],
    ("b", 1): [0.1, 0.2, 0.4],
}


def fake_study(
    tmp_path: Path, *, failed: tuple[str, int] | None = None, virtual_time: bool = False, monitors: dict | None = None, **fields
):
    """Two arms x two seeds of finished runs with the accuracies above (``failed`` crashed in round 2),
    whose module logged ``val/acc`` and ``val/nll`` and whose callbacks monitored ``monitors``."""
    (tmp_path / "base.yaml").write_text("{}")
    spec = study_from_dict(
        {
            "name": "fake",
            "base": "base.yaml",
            "seeds": [0, 1],
            "arms": {"a": {}, "b": {}},
            "directory": str(tmp_path / "out"),
            **fields,
        },
        root=tmp_path,
    )
    for run in plan(spec):
        key = (run.arm.name, run.seed)
        accuracy = ACCURACY[key][:2] if key == failed else ACCURACY[key]
        rows = []
        for r, acc in enumerate(accuracy):
            rows.append({"epoch": r, "step": r, "val/acc": acc, "val/nll": 1 - acc})
            rows.append({"step": r, "round/total_upload_bytes": 1024 * (r + 1), "round/accepted_clients": 2 + r + run.seed})
            if virtual_time:
                rows[-1][VIRTUAL_TIME] = 1.5 * (r + 1) + run.seed
        metrics = write_metrics(run.csv_dir / "version_0" / "metrics.csv", rows)
        algorithm = "tests.study.test_metrics.ReportingAlgorithm" if run.arm.name == "b" else "fl_lightning.FedAvg"
        (metrics.parent / "config.yaml").write_text(yaml.safe_dump({"trainer": {"algorithm": {"class_path": algorithm}}}))
        state = RunState(arm=run.arm.name, seed=run.seed, status=FAILED if key == failed else DONE)
        state.attempts.append({"wall_clock_s": 10.0 + run.seed})
        state.error = "RuntimeError: boom" if key == failed else None
        state.save(run)
        if key != failed:  # what the run's CompletionMarker records
            run.marker.write_text(json.dumps({"validation_metrics": ["val/acc", "val/nll"], "monitors": monitors or {}}))
    return spec


def arm_table(spec) -> dict[str, dict[str, str]]:
    return {row["arm"]: row for row in csv.DictReader((spec.study_dir / "summary.csv").read_text().splitlines())}


def test_a_min_mode_target_is_reached_from_above(tmp_path):
    # val/nll = 1 - val/acc: a 0.8 0.5 0.4 | 0.7 0.6 0.2, b 0.9 0.8 0.7 | 0.9 0.8 0.6.
    spec = fake_study(tmp_path, monitor="val/nll", mode="min", target_accuracy=0.6)
    write_tables(spec, spec.study_dir, collect(spec, plan(spec)))
    a, b = arm_table(spec)["a"], arm_table(spec)["b"]
    assert float(a["rounds_to_target_mean"]) == 2 and a["rounds_to_target_reached"] == "2"
    assert float(b["rounds_to_target_mean"]) == 3 and b["rounds_to_target_reached"] == "1"


def test_the_table_gives_mean_and_std_over_seeds_with_algorithm_and_study_columns(tmp_path):
    spec = fake_study(tmp_path, monitor="val/acc", mode="max", target_accuracy=0.5, metrics={"round/accepted_clients": "max"})
    records = collect(spec, plan(spec))
    write_tables(spec, spec.study_dir, records)
    rows = arm_table(spec)
    a, b = rows["a"], rows["b"]
    assert float(a["final/val/acc_mean"]) == pytest.approx(0.7) and float(a["final/val/acc_std"]) == pytest.approx(
        math.sqrt(0.02)
    )
    assert float(a["final/val/nll_mean"]) == pytest.approx(0.3) and "best/val/nll_mean" not in a
    assert float(a["rounds_to_target_mean"]) == pytest.approx(2.5) and a["rounds_to_target_reached"] == "2"
    assert b["rounds_to_target_mean"] == "" and b["rounds_to_target_reached"] == "0"
    assert float(a["total_upload_bytes_mean"]) == 3072 and float(a["total_upload_bytes_std"]) == 0
    assert float(a["wall_clock_s_mean"]) == 10.5
    # The study's column for every run; the algorithm's (`summary_metrics`: mean) for arm b's runs.
    assert float(a["max/round/accepted_clients_mean"]) == pytest.approx(4.5) and float(
        b["max/round/accepted_clients_mean"]
    ) == pytest.approx(4.5)
    assert a["mean/round/accepted_clients_mean"] == "" and float(b["mean/round/accepted_clients_mean"]) == pytest.approx(3.5)
    markdown = (spec.study_dir / "summary.md").read_text()
    header = next(line for line in markdown.splitlines() if line.startswith("| arm"))
    assert header == (
        "| arm | runs | val/acc (final) | val/acc (best) | val/nll (final) | rounds to 0.5 | uploaded | downloaded | wall-clock "
        "| round/accepted_clients (max) | round/accepted_clients (mean) |"
    )
    assert "| a | 2/2 | 0.7000 ± 0.1414 | 0.7000 ± 0.1414 |" in markdown
    assert "3.00 ± 0.00 KiB" in markdown and "— (0/2 reached)" in markdown
    runs = list(csv.DictReader((spec.study_dir / "runs.csv").read_text().splitlines()))
    assert [(r["arm"], r["seed"], r["status"]) for r in runs] == [
        ("a", "0", "done"),
        ("a", "1", "done"),
        ("b", "0", "done"),
        ("b", "1", "done"),
    ]


def test_a_failed_run_is_left_out_of_the_means_and_listed_with_its_error(tmp_path):
    spec = fake_study(tmp_path, failed=("a", 1))
    write_tables(spec, spec.study_dir, collect(spec, plan(spec)))
    a = arm_table(spec)["a"]
    assert (a["done"], a["failed"], a["errors"]) == ("1", "1", "seed 1: RuntimeError: boom")
    assert float(a["final/val/acc_mean"]) == pytest.approx(0.6) and a["final/val/acc_std"] == ""
    markdown = (spec.study_dir / "summary.md").read_text()
    assert "| a | 1/2 (1 failed) | 0.6000 |" in markdown
    assert "- `a` seed 1 (failed): RuntimeError: boom" in markdown


def test_without_a_study_monitor_the_runs_monitor_decides_best_and_every_validation_metric_is_reported(tmp_path):
    spec = fake_study(tmp_path, monitors={"val/nll": "min"})
    cols, rows = write_tables(spec, spec.study_dir, collect(spec, plan(spec)))
    assert [c.label for c in cols[:3]] == ["val/nll (final)", "val/nll (best)", "val/acc (final)"]
    assert float(rows[0]["best/val/nll_mean"]) == pytest.approx(0.3)  # min over rounds: 1 - max accuracy
    (tmp_path / "plain").mkdir()
    plain = fake_study(tmp_path / "plain")
    assert [c.key for c in columns(plain, collect(plain, plan(plain)))][:2] == ["final/val/acc", "final/val/nll"]


def test_a_study_monitor_the_runs_never_logged_is_named(tmp_path):
    spec = fake_study(tmp_path, monitor="val_acc", mode="max")
    with pytest.raises(ValueError, match=r"monitored metric 'val_acc' was never logged; the logged metrics are \[.*'val/acc'"):
        collect(spec, plan(spec))


def test_plots_have_one_mean_line_and_band_per_arm_with_labelled_axes(tmp_path):
    pytest.importorskip("matplotlib")
    spec = fake_study(tmp_path, virtual_time=True)
    records = collect(spec, plan(spec))
    histories = {arm: [r.history for r in records if r.arm == arm] for arm in ("a", "b")}
    plots = plot_specs(["val/acc", "val/nll"])
    figure = draw(plots[0], histories, target=0.5)
    axes = figure.axes[0]
    lines = axes.get_lines()
    assert [line.get_label() for line in lines] == ["a (n=2)", "b (n=2)", "target 0.5"]
    assert list(lines[0].get_xdata()) == [1, 2, 3] and list(lines[0].get_ydata()) == pytest.approx([0.25, 0.45, 0.7])
    assert len(axes.collections) == 2
    assert (axes.get_xlabel(), axes.get_ylabel()) == ("round", "val/acc")
    assert draw(plots[1], histories).axes[0].get_xlabel() == "uploaded by all clients (KiB)"
    virtual = draw(plots[2], histories).axes[0]
    assert virtual.get_xlabel() == "virtual time" and len(virtual.get_lines()) == 2  # no target given

    paths = write_plots(tmp_path / "plots", histories, metrics=["val/acc", "val/nll"], study="fake", target=0.5)
    assert sorted(paths) == ["val_acc_vs_round", "val_acc_vs_upload", "val_acc_vs_virtual_time", "val_nll_vs_round"]
    assert all(path.read_bytes().startswith(b"\x89PNG\r\n\x1a\n") for path in paths.values())
    # Without virtual time in the logs there is no such plot.
    for history in histories["a"] + histories["b"]:
        for row in history:
            row.pop(VIRTUAL_TIME)
    assert "val_acc_vs_virtual_time" not in write_plots(tmp_path / "plots2", histories, metrics=["val/acc"])


def test_missing_matplotlib_says_how_to_get_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ModuleNotFoundError, match=r"pip install 'fl-lightning\[plots\]'.*plots: false"):
        require_matplotlib()
