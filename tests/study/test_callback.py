"""``WandbRunSummary``: x-axes declared, final and best metrics in the run summary, history checkpointed."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest
import torch

pytest.importorskip("wandb")
from lightning.pytorch.callbacks import EarlyStopping
from lightning.pytorch.loggers import CSVLogger, WandbLogger

from fl_lightning.study.callback import ROUND_AXIS, CompletionMarker, WandbRunSummary

from .test_metrics import ReportingAlgorithm


class FakeRun:
    def __init__(self) -> None:
        self.defined: dict[str, dict[str, Any]] = {}
        self.summary: dict[str, Any] = {}

    def define_metric(self, name: str, **kwargs: Any) -> None:
        self.defined[name] = kwargs


@pytest.fixture(autouse=True)
def module_logs_slash_names(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fake trainer's module logged ``val/acc`` and ``val/nll`` in validation."""
    monkeypatch.setattr("fl_lightning.study.callback.logged_validation_metrics", lambda trainer: ["val/acc", "val/nll"])


def fake_trainer(run: FakeRun, tmp_path, callbacks: list | None = None) -> SimpleNamespace:
    loggers = [CSVLogger(tmp_path), WandbLogger(experiment=run)]
    return SimpleNamespace(loggers=loggers, callback_metrics={}, algorithm=ReportingAlgorithm(), callbacks=callbacks or [])


def play(callback: WandbRunSummary, trainer: SimpleNamespace, rounds: list[tuple[int, float, float]]) -> None:
    for round_idx, acc, accepted in rounds:
        trainer.callback_metrics.update({"val/acc": torch.tensor(acc), "val/nll": torch.tensor(1 - acc)})
        callback.on_round_aggregated(
            trainer, None, round_idx, {"round/total_upload_bytes": 10.0 * (round_idx + 1), "round/accepted_clients": accepted}
        )


def test_the_round_is_the_x_axis_and_the_summary_has_final_best_and_algorithm_metrics(tmp_path):
    run = FakeRun()
    trainer = fake_trainer(run, tmp_path)
    callback = WandbRunSummary(monitor="val/acc", mode="max", target_accuracy=0.6, metrics={"round/total_upload_bytes": "max"})
    callback.setup(trainer, None, "fit")
    assert run.defined[ROUND_AXIS] == {} and run.defined["*"]["step_metric"] == ROUND_AXIS
    assert run.defined["round/virtual_time"]["summary"] == "max"

    play(callback, trainer, [(0, 0.5, 2.0), (1, 0.7, 4.0), (2, 0.65, 3.0)])
    callback.on_fit_end(trainer, None)
    assert run.summary["final/val/acc"] == pytest.approx(0.65) and run.summary["best/val/acc"] == pytest.approx(0.7)
    assert run.summary["final/val/nll"] == pytest.approx(0.35) and run.summary["rounds_to_target"] == 2
    assert "best/val/nll" not in run.summary  # best of the monitored metric only
    assert run.summary["total_upload_bytes"] == 30.0 and run.summary["max/round/total_upload_bytes"] == 30.0
    assert run.summary["mean/round/accepted_clients"] == pytest.approx(3.0)  # ReportingAlgorithm.summary_metrics
    assert "total_download_bytes" not in run.summary  # never logged


def test_a_resumed_run_summarises_the_rounds_before_the_checkpoint_too(tmp_path):
    first = WandbRunSummary(monitor="val/acc", mode="max", target_accuracy=0.6)
    play(first, fake_trainer(FakeRun(), tmp_path), [(0, 0.5, 1.0), (1, 0.7, 1.0)])
    resumed = WandbRunSummary(monitor="val/acc", mode="max", target_accuracy=0.6)
    resumed.load_state_dict(first.state_dict())
    run = FakeRun()
    trainer = fake_trainer(run, tmp_path)
    play(resumed, trainer, [(1, 0.55, 1.0), (2, 0.58, 1.0)])  # round 1 re-run after a mid-round resume
    resumed.on_fit_end(trainer, None)
    assert [row["round"] for row in resumed.history] == [0.0, 1.0, 2.0]
    assert run.summary["best/val/acc"] == pytest.approx(0.58) and run.summary["rounds"] == 3.0
    assert "rounds_to_target" not in run.summary


def test_without_a_study_monitor_the_runs_own_monitor_is_used(tmp_path):
    run = FakeRun()
    trainer = fake_trainer(run, tmp_path, callbacks=[EarlyStopping(monitor="val/nll", mode="min")])
    callback = WandbRunSummary()
    play(callback, trainer, [(0, 0.5, 1.0), (1, 0.7, 1.0), (2, 0.6, 1.0)])
    callback.on_fit_end(trainer, None)
    assert run.summary["best/val/nll"] == pytest.approx(0.3) and run.summary["final/val/acc"] == pytest.approx(0.6)


def test_a_monitor_the_run_never_logged_is_named(tmp_path):
    trainer = fake_trainer(FakeRun(), tmp_path)
    callback = WandbRunSummary(monitor="val_acc", mode="max")
    play(callback, trainer, [(0, 0.5, 1.0)])
    with pytest.raises(ValueError, match=r"monitored metric 'val_acc' was never logged; the logged metrics are \[.*'val/acc'"):
        callback.on_fit_end(trainer, None)


@pytest.mark.parametrize(
    ("sigterm", "interrupted", "written"), [(False, False, True), (True, False, False), (False, True, False)]
)
def test_the_completion_marker_is_written_only_when_fit_ends_normally(tmp_path, sigterm, interrupted, written):
    marker = tmp_path / "completed.json"
    trainer = SimpleNamespace(
        received_sigterm=sigterm, interrupted=interrupted, current_epoch=3, callbacks=[EarlyStopping(monitor="val/nll")]
    )
    CompletionMarker(str(marker)).on_fit_end(trainer, None)
    assert marker.is_file() == written
    if written:
        recorded = json.loads(marker.read_text())
        assert recorded["rounds"] == 3 and recorded["validation_metrics"] == ["val/acc", "val/nll"]
        assert recorded["monitors"] == {"val/nll": "min"}
