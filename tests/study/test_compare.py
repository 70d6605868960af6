"""Studies end to end: real ``fl-lightning fit`` processes on a tiny federation, offline."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from PIL import Image

from fl_lightning.study import load_study, run_study
from fl_lightning.study.metrics import metrics_files, read_history
from fl_lightning.study.plots import draw, plot_specs

from ..wandb_offline import offline_runs

FEDPROX = {"trainer.algorithm": {"class_path": "fl_lightning.FedProx", "init_args": {"mu": 0.1}}}


def table(path: Path) -> dict[str, dict[str, str]]:
    return {row["arm"]: row for row in csv.DictReader(path.read_text().splitlines())}


def run_state(study: Path, arm: str, seed: int) -> dict:
    return json.loads((study / "runs" / arm / f"seed_{seed}" / "run.json").read_text())


def test_two_arms_two_seeds_give_table_plots_and_grouped_wandb_runs(write_study, study_env):
    pytest.importorskip("matplotlib")
    study = write_study(
        name="tiny",
        seeds=[0, 1],
        monitor="val/acc",
        mode="max",
        target_accuracy=0.25,
        workers=2,
        arms={"fedavg": {}, "fedprox": FEDPROX},
        wandb={"project": "fl-study-test", "tags": ["unit"]},
    )
    result = run_study(load_study(study))
    assert sorted(result.attempted) == ["fedavg/seed_0", "fedavg/seed_1", "fedprox/seed_0", "fedprox/seed_1"]

    # The table: both arms, mean and std over the two seeds of every run's numbers.
    arms = table(result.summary_csv)
    runs = list(csv.DictReader((result.directory / "runs.csv").read_text().splitlines()))
    assert list(arms) == ["fedavg", "fedprox"]
    for arm, row in arms.items():
        assert (row["runs"], row["done"], row["failed"]) == ("2", "2", "0")
        finals = [float(r["final/val/acc"]) for r in runs if r["arm"] == arm]
        assert len(finals) == 2 and len(set(finals)) == 2  # the seeds differ
        assert float(row["final/val/acc_mean"]) == pytest.approx(sum(finals) / 2)
        assert float(row["final/val/acc_std"]) == pytest.approx(abs(finals[0] - finals[1]) / 2**0.5)
        for key in ("best/val/acc", "final/val/nll", "total_upload_bytes", "wall_clock_s"):
            assert float(row[f"{key}_mean"]) > 0 and float(row[f"{key}_std"]) >= 0
        assert float(row["total_upload_bytes_mean"]) == float(runs[0]["total_upload_bytes"])  # 3 rounds x 2 clients
    assert sum(int(row["rounds_to_target_reached"]) for row in arms.values()) > 0
    markdown = result.summary_markdown.read_text()
    assert "| fedavg | 2/2 |" in markdown and "| fedprox | 2/2 |" in markdown and " ± " in markdown

    # The plots: valid PNGs; one mean line per arm, a band each, and the target line.
    assert set(result.plots) == {"val_acc_vs_round", "val_acc_vs_upload", "val_nll_vs_round"}  # no virtual time
    for path in result.plots.values():
        with Image.open(path) as image:
            image.verify()
            assert image.format == "PNG"
    histories = {arm: [r.history for r in result.records if r.arm == arm] for arm in arms}
    for plot in plot_specs(["val/acc"])[:2]:
        axes = draw(plot, histories, target=0.25).axes[0]
        assert [line.get_label() for line in axes.get_lines()] == ["fedavg (n=2)", "fedprox (n=2)", "target 0.25"]
        assert len(axes.collections) == 2  # the ±1 std bands
        assert [len(line.get_xdata()) for line in axes.get_lines()[:2]] == [3, 3]

    # W&B: four offline runs in group "tiny" with job_type = arm, their resolved config and summary.
    wandb_runs = offline_runs(result.directory)
    summary_runs = [r for r in wandb_runs if r.job_type == "summary"]
    training = sorted((r for r in wandb_runs if r.job_type != "summary"), key=lambda r: (r.job_type, r.config["study"]["seed"]))
    assert [(r.job_type, r.config["study"]["seed"]) for r in training] == [
        ("fedavg", 0),
        ("fedavg", 1),
        ("fedprox", 0),
        ("fedprox", 1),
    ]
    for run in training:
        assert (run.project, run.group) == ("fl-study-test", "tiny")
        assert set(run.tags) == {"unit", run.job_type}
        resolved = run.config.get("config", run.config)  # the CLI's resolved config
        assert resolved["seed_everything"] == resolved["trainer"]["seed"] == run.config["study"]["seed"]
        expected = "fl_lightning.FedProx" if run.job_type == "fedprox" else "fl_lightning.FedAvg"
        assert resolved["trainer"]["algorithm"]["class_path"] == expected
        assert run.step_metrics["val/acc"] == "round"  # the round is the x-axis
        assert [row["round"] for row in run.history if "val/acc" in row] == [0, 1, 2]
        row = next(r for r in runs if r["arm"] == run.job_type and int(r["seed"]) == run.config["study"]["seed"])
        assert run.summary["best/val/acc"] == pytest.approx(float(row["best/val/acc"]))
        assert run.summary["final/val/nll"] == pytest.approx(float(row["final/val/nll"]))
        assert run.summary.get("rounds_to_target") == (int(row["rounds_to_target"]) if row["rounds_to_target"] else None)
    (summary,) = summary_runs
    assert summary.group == "tiny"
    assert summary.summary["summary_table/_type"] == "table-file" and summary.summary["summary_table/nrows"] == 2


def test_rerunning_an_interrupted_study_finishes_only_the_missing_runs(write_study, study_env):
    crash = {"class_path": "tests.study.helpers.CrashOnce", "init_args": {"marker": str(study_env / "crashed"), "seed": 1}}
    study = write_study(name="resume", seeds=[0, 1], plots=False, workers=2, arms={"fedavg": {"trainer.callbacks": [crash]}})

    first = run_study(load_study(study))
    assert sorted(first.attempted) == ["fedavg/seed_0", "fedavg/seed_1"]
    crashed = run_state(first.directory, "fedavg", 1)
    assert crashed["status"] == "failed" and "simulated crash in round 1" in crashed["error"]
    assert table(first.summary_csv)["fedavg"]["done"] == "1"
    assert "simulated crash" in first.summary_markdown.read_text()

    second = run_study(load_study(study))
    assert (second.attempted, second.skipped) == (["fedavg/seed_1"], ["fedavg/seed_0"])
    assert len(run_state(second.directory, "fedavg", 0)["attempts"]) == 1
    resumed = run_state(second.directory, "fedavg", 1)
    assert resumed["status"] == "done" and len(resumed["attempts"]) == 2
    assert resumed["attempts"][1]["resumed_from"].endswith("checkpoints/last.ckpt")
    # The second attempt started at round 1 (round 0 was in the checkpoint); together they cover every round.
    files = metrics_files(second.directory / "runs" / "fedavg" / "seed_1" / "csv")
    assert [[int(r["round"]) for r in read_history([f]) if "val/acc" in r] for f in files] == [[0], [1, 2]]
    row = table(second.summary_csv)["fedavg"]
    assert (row["done"], row["failed"]) == ("2", "0") and float(row["final/val/acc_std"]) >= 0


def test_an_arm_with_a_bad_config_is_reported_failed_and_the_others_complete(write_study):
    pytest.importorskip("matplotlib")
    study = write_study(
        name="broken",
        seeds=[0],
        workers=2,
        arms={"good": {}, "broken": {"trainer.algorithm": {"class_path": "fl_lightning.NoSuchAlgorithm"}}},
    )
    result = run_study(load_study(study))

    rows = table(result.summary_csv)
    assert (rows["good"]["done"], rows["good"]["failed"]) == ("1", "0")
    assert (rows["broken"]["done"], rows["broken"]["failed"]) == ("0", "1")
    assert "NoSuchAlgorithm" in rows["broken"]["errors"] and rows["broken"]["final/val/acc_mean"] == ""
    markdown = result.summary_markdown.read_text()
    assert "| broken | 0/1 (1 failed) |" in markdown and "NoSuchAlgorithm" in markdown
    assert "| arm | runs | val/acc (final) | val/nll (final) | uploaded | downloaded | wall-clock |\n" in markdown
    histories = {arm: [r.history for r in result.records if r.arm == arm and r.status == "done"] for arm in rows}
    axes = draw(plot_specs(["val/acc"])[0], {k: v for k, v in histories.items() if v}).axes[0]
    assert [line.get_label() for line in axes.get_lines()] == ["good (n=1)"]
