"""benchmarks/real_data.py: its comparison, its run of a real paper config (on a stand-in dataset), its
missing-data line, and that the configs and round counts it names are the shipped ones."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from benchmarks import real_data
from benchmarks.real_data import Row, accuracy, exit_status, rows_for, verdict
from benchmarks.real_data_numbers import CONFIGS, REAL_DATASETS, PaperNumber, RealDataConfig

from .config_runs import CONFIGS as CONFIG_ROOT

PAPERS = CONFIG_ROOT / "papers"


def test_verdict_against_the_tolerance_at_the_papers_round_only():
    number = PaperNumber("test_acc", 84.6, 200, "Table 1", std=0.5)  # tolerance 1.5
    assert number.tolerance == 1.5
    assert [verdict(x, number, 200) for x in (83.1, 86.1, 83.0, 86.2)] == ["within", "within", "below", "above"]
    assert verdict(99.0, number, 5) == verdict(None, number, 200) == "no paper number"
    assert PaperNumber("a", 78.9, 200, "Table 8").tolerance == 3.0  # no std: 3 points
    assert PaperNumber("a", 90.2, 100, "Table 1", std=0.1).tolerance == 1.0  # floor of 1 point


def test_accuracy_is_the_last_logged_value_in_percent_and_a_pattern_takes_the_best_centre():
    history = [
        {"round": 0.0, "test_acc": 0.5, "round/src0_c0_acc": 0.2, "round/src0_c1_acc": 0.7},
        {"round": 1.0, "round/src0_c0_acc": 0.81, "round/src0_c1_acc": 0.3, "round/src1_c0_acc": 0.99},
        {"round": 2.0, "val_acc": 0.9},
    ]
    assert accuracy(history, "test_acc") == (50.0, 3)
    assert accuracy(history, "round/src0_c*_acc") == (81.0, 3)
    assert accuracy(history, "missing") == (None, 3)
    assert accuracy([], "test_acc") == (None, None)


def test_rows_compare_each_number_and_the_exit_status_says_what_failed():
    spec = RealDataConfig(
        "fedsoft_cifar10",
        "round/src0_c*_acc",
        numbers=(PaperNumber("round/src0_c*_acc", 78.9, 2, "T8 0"), PaperNumber("round/src1_c*_acc", 79.0, 2, "T8 90")),
    )
    history = [{"round": 0.0}, {"round": 1.0, "round/src0_c0_acc": 0.70, "round/src1_c1_acc": 0.785}]
    rows = rows_for(spec, history)
    assert [(r.rounds, r.ours, r.verdict) for r in rows] == [(2, 70.0, "below"), (2, 78.5, "within")]
    assert exit_status(rows) == 1
    missing = Row("x", None, None, None, "MNIST was not found", real_data.MISSING)
    assert exit_status([rows[1], missing]) == 2
    assert exit_status([rows[1]]) == 0
    none = rows_for(RealDataConfig("flexible_mnist", "test_acc", no_number="figures only"), [{"round": 4.0, "test_acc": 0.9}])
    assert [(r.rounds, r.ours, r.paper, r.where, r.verdict) for r in none] == [(5, 90.0, None, "figures only", "no paper number")]


def test_the_table_keeps_one_row_per_line_and_its_columns_whatever_a_cell_holds():
    failed = Row("flexible_mnist", None, None, None, "lost |T| = 8 cells\nsecond line", "run failed")
    header, rule, line = real_data.table([failed])
    assert line.count(" | ") == header.count(" | ") and "\\|T\\|" in line and "\n" not in line


def test_every_real_data_paper_config_is_listed_exists_and_its_paper_round_is_the_configs():
    shipped = {p.stem for p in PAPERS.glob("*.yaml") if any(cls in p.read_text() for cls in REAL_DATASETS)}
    assert {spec.name for spec in CONFIGS} == shipped
    for spec in CONFIGS:
        config = yaml.safe_load((PAPERS / f"{spec.name}.yaml").read_text())
        assert real_data._real_datasets(config), spec.name
        assert bool(spec.numbers) != bool(spec.no_number), spec.name  # a number, or why there is none
        for number in spec.numbers:
            assert number.round == config["trainer"]["max_epochs"], spec.name  # --full runs the paper's rounds


@pytest.mark.usefixtures("offline")
def test_one_round_of_a_paper_config_end_to_end_on_a_stand_in_dataset(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    out = tmp_path / "report.md"
    argv = ["--configs", "fedmrn_fmnist_fedavg", "--rounds", "1", "--accelerator", "cpu", "--out", str(out)]
    assert real_data.main([*argv, "--data-dir", str(tmp_path / "data"), "--out-dir", str(tmp_path / "runs")]) == 0
    lines = [line for line in out.read_text().splitlines() if line.startswith("| fedmrn_fmnist_fedavg")]
    assert len(lines) == 1
    cells = [cell.strip() for cell in lines[0].strip("|").split("|")]
    assert cells[:2] == ["fedmrn_fmnist_fedavg", "1"]
    assert 0.0 <= float(cells[2]) <= 100.0  # the stand-in's random labels: any accuracy, but one was logged
    assert cells[3:5] == ["90.5", "100"] and "Table 1" in cells[5] and cells[7] == "no paper number"
    written = yaml.safe_load((tmp_path / "runs" / "fedmrn_fmnist_fedavg.yaml").read_text())
    assert written["data"]["init_args"]["train"]["init_args"]["root"] == str(tmp_path / "data")
    assert written["data"]["init_args"]["partitioner"]["init_args"] == {"alpha": 0.3, "min_samples": 10}  # untouched


def test_a_missing_dataset_is_one_line_naming_it_and_how_to_get_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys):
    monkeypatch.chdir(tmp_path)
    argv = ["--configs", "flexible_mnist", "--accelerator", "cpu", "--data-dir", str(tmp_path / "empty")]
    assert real_data.main([*argv, "--out-dir", str(tmp_path / "runs")]) == 2
    output = capsys.readouterr().out
    (line,) = [line for line in output.splitlines() if line.startswith("| flexible_mnist")]
    assert "MNIST was not found" in line and "--download" in line and str(tmp_path / "empty") in line
    assert line.rstrip(" |").endswith(real_data.MISSING)
    assert "Traceback" not in output
