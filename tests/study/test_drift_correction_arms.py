"""SCAFFOLD and FedDyn can be arms of an ``fl-lightning-compare`` study: each arm parses as a run config."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from fl_lightning.study.config_check import config_error
from fl_lightning.study.runner import plan, prepare
from fl_lightning.study.spec import study_from_dict

QUICKSTART = Path(__file__).resolve().parents[2] / "configs" / "quickstart.yaml"


def test_scaffold_and_feddyn_arms_parse(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["fl-lightning-compare"])
    arms = {
        "scaffold": {"trainer.algorithm": {"class_path": "fl_lightning.SCAFFOLD", "init_args": {"global_lr": 1.0}}},
        "feddyn": {"trainer.algorithm": {"class_path": "fl_lightning.FedDyn", "init_args": {"alpha": 0.01}}},
        "feddyn_typo": {"trainer.algorithm": {"class_path": "fl_lightning.FedDyn", "init_args": {"alpah": 0.01}}},
    }
    spec = study_from_dict({"name": "drift", "base": str(QUICKSTART), "seeds": [0, 1], "arms": arms}, root=tmp_path)
    errors = {run.arm.name: config_error(prepare(spec, run)[1][3:]) for run in plan(spec) if run.seed == 0}
    assert errors["scaffold"] is None and errors["feddyn"] is None
    assert errors["feddyn_typo"] is not None and "alpah" in errors["feddyn_typo"]
