"""``WandbRunSummary``: x-axes declared, final and best metrics in the run summary, history checkpointed."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

pytest.importorskip("wandb")
from lightning.pytorch.loggers import CSVLogger, WandbLogger

from fl_lightning.study.callback import ROUND_AXIS, CompletionMarker, WandbRunSummary

from .test_metrics import ReportingAlgorithm


class FakeRun:
    def __init__(self) -> None:
        self.defined: dict[str, dict[str, Any]] = {}
        self.summary: dict[str, Any] = {}

    def define_metric(self, name: str, **kwargs: Any) -> None:
        self.defined[name] = kwargs


def fake_trainer(run: FakeRun, tmp_path) -> SimpleNamespace:
    loggers = [CSVLogger(tmp_path), WandbLogger(experiment=run)]
    return SimpleNamespace(loggers=loggers, callback_metrics={}, algorithm=ReportingAlgorithm())


def play(callback: WandbRunSummary, trainer: SimpleNamespace, rounds: list[tuple[int, float, float]]) -> None:
    for round_idx, acc, accepted in rounds:
        trainer.callback_metrics.update(val_acc=torch.tensor(acc), val_loss=torch.tensor(1 - acc))
        callback.on_round_aggregated(
            trainer, None, round_idx, {"round/total_upload_bytes": 10.0 * (round_idx + 1), "round/accepted_clients": accepted}
        )


def test_the_round_is_the_x_axis_and_the_summary_has_final_best_and_algorithm_metrics(tmp_path):
    run = FakeRun()
    trainer = fake_trainer(run, tmp_path)
    callback = WandbRunSummary(target_accuracy=0.6, metrics={"round/total_upload_bytes": "max"})
    callback.setup(trainer, None, "fit")
    assert run.defined[ROUND_AXIS] == {} and run.defined["*"]["step_metric"] == ROUND_AXIS
    assert run.defined["round/virtual_time"]["summary"] == "max"

    play(callback, trainer, [(0, 0.5, 2.0), (1, 0.7, 4.0), (2, 0.65, 3.0)])
    callback.on_fit_end(trainer, None)
    assert run.summary["final/val_acc"] == pytest.approx(0.65) and run.summary["best/val_acc"] == pytest.approx(0.7)
    assert run.summary["best/val_loss"] == pytest.approx(0.3) and run.summary["rounds_to_target"] == 2
    assert run.summary["total_upload_bytes"] == 30.0 and run.summary["max/round/total_upload_bytes"] == 30.0
    assert run.summary["mean/round/accepted_clients"] == pytest.approx(3.0)  # ReportingAlgorithm.summary_metrics
    assert "total_download_bytes" not in run.summary  # never logged


def test_a_resumed_run_summarises_the_rounds_before_the_checkpoint_too(tmp_path):
    first = WandbRunSummary(target_accuracy=0.6)
    play(first, fake_trainer(FakeRun(), tmp_path), [(0, 0.5, 1.0), (1, 0.7, 1.0)])
    resumed = WandbRunSummary(target_accuracy=0.6)
    resumed.load_state_dict(first.state_dict())
    run = FakeRun()
    trainer = fake_trainer(run, tmp_path)
    play(resumed, trainer, [(1, 0.55, 1.0), (2, 0.58, 1.0)])  # round 1 re-run after a mid-round resume
    resumed.on_fit_end(trainer, None)
    assert [row["round"] for row in resumed.history] == [0.0, 1.0, 2.0]
    assert run.summary["best/val_acc"] == pytest.approx(0.58) and run.summary["rounds"] == 3.0
    assert "rounds_to_target" not in run.summary


@pytest.mark.parametrize(
    ("sigterm", "interrupted", "written"), [(False, False, True), (True, False, False), (False, True, False)]
)
def test_the_completion_marker_is_written_only_when_fit_ends_normally(tmp_path, sigterm, interrupted, written):
    marker = tmp_path / "completed.json"
    trainer = SimpleNamespace(received_sigterm=sigterm, interrupted=interrupted, current_epoch=3)
    CompletionMarker(str(marker)).on_fit_end(trainer, None)
    assert marker.is_file() == written
    if written:
        assert '"rounds": 3' in marker.read_text()
