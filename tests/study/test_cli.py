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


@pytest.mark.parametrize(
    ("study", "options", "message"),
    [
        ("", ["--wandb_mode", "offline"], "`--wandb_mode` needs W&B on"),
        ("monitor: val/acc\nmode: max\ntarget_accuracy: .nan\n", [], "`target_accuracy` must be a finite number"),
    ],
)
def test_a_bad_study_or_option_is_one_error_line_and_exit_status_2(tmp_path, monkeypatch, capsys, study, options, message):
    monkeypatch.setattr(sys, "argv", ["fl-lightning-compare"])
    monkeypatch.delenv("FL_LIGHTNING_DEBUG", raising=False)
    fake_study(tmp_path)
    path = tmp_path / "study.yaml"
    path.write_text("name: fake\nbase: base.yaml\nseeds: [0]\narms: {a: {}}\n" + study)
    with pytest.raises(SystemExit) as exit_:
        main([str(path), *options, "--report_only", "true"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1, err


def test_missing_matplotlib_is_one_error_line_before_any_run(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["fl-lightning-compare"])
    monkeypatch.delenv("FL_LIGHTNING_DEBUG", raising=False)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    fake_study(tmp_path)
    path = tmp_path / "study.yaml"
    path.write_text(f"name: fake\nbase: base.yaml\nseeds: [0]\narms: {{a: {{}}}}\ndirectory: {tmp_path / 'fresh'}\n")
    with pytest.raises(SystemExit) as exit_:
        main([str(path)])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "pip install 'fl-lightning[plots]'" in err and err.count("\n") == 1, err
    assert not (tmp_path / "fresh").exists()


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
