"""``fl-lightning-compare`` options, without launching runs (``--report_only``)."""

from __future__ import annotations

import sys

import pytest

from fl_lightning.study.cli import main

from .test_report import fake_study


def test_report_only_rewrites_the_tables_for_the_chosen_arms(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["fl-lightning-compare"])
    spec = fake_study(tmp_path)
    study = tmp_path / "study.yaml"
    study.write_text(f"name: fake\nbase: base.yaml\nseeds: [0, 1]\narms: {{a: {{}}, b: {{}}}}\ndirectory: {spec.study_dir}\n")
    main([str(study), "--report_only", "true", "--plots", "false", "--arms", "[b]"])
    out = capsys.readouterr().out
    assert "2 of 2 runs already done" in out and "Study fake" in out
    assert (spec.study_dir / "summary.md").read_text().count("| b | 2/2 |") == 1
    assert "| a |" not in (spec.study_dir / "summary.md").read_text()
    assert not (spec.study_dir / "plots").exists()


def test_a_wandb_mode_needs_a_wandb_project(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["fl-lightning-compare"])
    fake_study(tmp_path)
    study = tmp_path / "study.yaml"
    study.write_text("name: fake\nbase: base.yaml\nseeds: [0]\narms: {a: {}}\n")
    with pytest.raises(ValueError, match="needs W&B on"):
        main([str(study), "--wandb_mode", "offline", "--report_only", "true"])
