"""Ditto and FedBN can be arms of an ``fl-lightning-compare`` study, beside FedAvg on the quickstart."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from fl_lightning.study.config_check import config_error
from fl_lightning.study.runner import plan, prepare
from fl_lightning.study.spec import study_from_dict

ROOT = Path(__file__).resolve().parents[2]


def test_ditto_and_fedbn_arms_give_configurations_that_parse(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tmp_path)  # the study writes its run folders here
    monkeypatch.setattr(sys, "argv", ["fl-lightning-compare"])
    spec = study_from_dict(
        {
            "name": "personalized",
            "seeds": [0],
            "overrides": {"trainer.max_epochs": 2},
            "arms": {
                "fedavg": {"config": "configs/quickstart.yaml"},
                "ditto": {"config": "configs/baselines/ditto_digits.yaml", "trainer.algorithm.init_args.lam": 1.0},
                "fedbn": {"config": "configs/baselines/fedbn_digits.yaml"},
            },
        },
        root=ROOT,
    )
    for run in plan(spec):
        _, args = prepare(spec, run)
        assert config_error(args[3:]) is None, (run.name, config_error(args[3:]))
    bad = study_from_dict({"name": "bad", "seeds": [0], "arms": {
        "ditto": {"config": "configs/baselines/ditto_digits.yaml", "trainer.algorithm.init_args.lamda": 1.0}}}, root=ROOT)
    _, args = prepare(bad, plan(bad)[0])
    assert "lamda" in config_error(args[3:])
