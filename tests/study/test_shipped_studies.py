"""Every shipped study config loads, and each of its arms gives an ``fl-lightning fit`` configuration that parses."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from fl_lightning.study.config_check import config_error
from fl_lightning.study.runner import plan, prepare
from fl_lightning.study.spec import load_study

STUDIES = sorted((Path(__file__).resolve().parents[2] / "configs" / "studies").glob("*.yaml"))


def test_there_are_shipped_studies():
    assert {p.stem for p in STUDIES} >= {"fedavg_vs_fedprox_digits", "fedbuff_vs_fedstaleweight_digits"}


@pytest.mark.parametrize("path", STUDIES, ids=[p.stem for p in STUDIES])
def test_every_arm_of_a_shipped_study_parses(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tmp_path)  # the study writes its run folders here
    monkeypatch.setattr(sys, "argv", ["fl-lightning-compare"])
    spec = load_study(path)
    runs = plan(spec)
    assert {run.arm.name for run in runs} == {arm.name for arm in spec.arms}
    for run in runs:
        if run.seed == spec.seeds[0]:
            _, args = prepare(spec, run)
            assert config_error(args[3:]) is None, (run.name, config_error(args[3:]))
