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


@pytest.mark.parametrize("columns", ["80", "200"])
def test_the_summary_table_fits_the_console_width(tmp_path, monkeypatch, capsys, columns):
    # A log file (no terminal) takes COLUMNS, else 80: every line fits, every value whole.
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["fl-lightning-compare"])
    monkeypatch.setenv("COLUMNS", columns)
    spec = fake_study(tmp_path)
    study = tmp_path / "study.yaml"
    study.write_text(f"name: fake\nbase: base.yaml\nseeds: [0, 1]\narms: {{a: {{}}, b: {{}}}}\ndirectory: {spec.study_dir}\n")
    main([str(study), "--report_only", "true", "--plots", "false"])
    out = capsys.readouterr().out
    table = out[out.index("Study fake") : out.index("Tables:")].splitlines()
    assert max(map(len, table)) <= int(columns) and "…" not in "".join(table), "\n".join(table)
    arms_as_rows = any(line.startswith("│ a ") for line in table)
    assert arms_as_rows == (columns == "200")  # one row per arm when it fits, else one column per arm
    cells = {line.split("│")[1].strip(): line.split("│")[2:4] for line in table if line.count("│") == 4}
    if columns == "80":
        assert [c.strip() for c in cells["runs"]] == ["2/2", "2/2"]
        assert [c.strip() for c in cells["val/acc (final)"]] == ["0.7000 ± 0.1414", "0.3500 ± 0.0707"]
