"""FedNova and q-FedAvg can be named in an ``fl-lightning-compare`` study: each arm gives a configuration that parses."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from fl_lightning.study.config_check import config_error
from fl_lightning.study.metrics import algorithm_metrics
from fl_lightning.study.runner import plan, prepare
from fl_lightning.study.spec import study_from_dict

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def test_fednova_and_qffl_arms_parse(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["fl-lightning-compare"])
    spec = study_from_dict(
        {
            "name": "baselines",
            "base": str(CONFIGS / "quickstart.yaml"),
            "seeds": [0],
            "arms": {
                "fednova": {"trainer.algorithm": {"class_path": "fl_lightning.FedNova"}},
                "qffl": {"trainer.algorithm": {"class_path": "fl_lightning.QFedAvg", "init_args": {"q": 2.0}}},
            },
        },
        root=tmp_path,
    )
    runs = plan(spec)
    assert {run.arm.name for run in runs} == {"fednova", "qffl"}
    for run in runs:
        _, args = prepare(spec, run)
        assert config_error(args[3:]) is None, (run.name, config_error(args[3:]))
    assert algorithm_metrics("fl_lightning.QFedAvg") == {"clients/acc_worst10": "final"}
    assert algorithm_metrics("fl_lightning.FedNova") == {"round/tau_eff": "mean"}
