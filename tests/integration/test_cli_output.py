"""What a ``fl-lightning`` run prints and where it writes: no warnings, one plain line per round in a log
file, the config in the run's own directory only, plain-text help."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from fl_lightning.cli import main

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = str(ROOT / "configs" / "quickstart.yaml")
SPHINX = re.compile(r":[a-z]+:`|``")


pytestmark = pytest.mark.usefixtures("cli_in_tmp_path")


def test_quickstart_in_a_log_file_prints_no_warning_and_one_line_per_round(tmp_path: Path) -> None:
    # What the console script runs, in a fresh process with Python's default warning filters, its
    # output going to a file (SLURM, CI); PYTHONPATH without the suite's start-up trim (tests/startup), as a user's.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"} | {"PYTHONPATH": str(ROOT), "COLUMNS": "80"}
    script = "from fl_lightning.cli import main; main()"
    with open(tmp_path / "log.txt", "w") as log:
        subprocess.run(
            [sys.executable, "-c", script, "fit", "--config", QUICKSTART, "--trainer.max_epochs", "2"],
            stdout=log, stderr=subprocess.STDOUT, env=env, check=True, timeout=600,
        )  # fmt: skip
    output = (tmp_path / "log.txt").read_text()
    assert not re.search(r"warn|deprecat|💡", output, re.IGNORECASE), output
    rounds = [line for line in output.splitlines() if line.startswith("rounds ")]
    assert [line.split()[1] for line in rounds] == ["1/2", "2/2"], output
    assert all(re.search(r"val_acc=[\d.]+ .* elapsed \d+:\d\d:\d\d  eta \d+:\d\d:\d\d$", line) for line in rounds), rounds
    assert "…" not in output  # nothing cut at 80 columns (the summary table wraps instead)


def test_each_run_saves_its_config_in_its_own_directory(tmp_path: Path) -> None:
    for rounds in (1, 2):
        main(["fit", "--config", QUICKSTART, "--trainer.max_epochs", str(rounds), "--trainer.enable_progress_bar", "false"])
    for version, rounds in ((0, 1), (1, 2)):
        config = yaml.safe_load((tmp_path / "logs" / "quickstart" / f"version_{version}" / "config.yaml").read_text())
        assert config["trainer"]["max_epochs"] == rounds
    assert sorted(p.name for p in tmp_path.iterdir()) == ["logs"]


def test_without_a_logger_nothing_lands_in_the_current_directory_but_checkpoints(tmp_path: Path) -> None:
    main(["fit", "--config", QUICKSTART, "--trainer.max_epochs", "1", "--trainer.logger", "false"]
         + ["--trainer.enable_progress_bar", "false"])  # fmt: skip
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoints"]  # Lightning's place for them, without a logger
    assert not list(tmp_path.rglob("config.yaml"))


@pytest.mark.parametrize("args", [["--help"], ["fit", "--help"], ["fit", "--trainer.algorithm.help", "FedProx"]])
def test_help_is_plain_text(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code in (0, None)
    out = capsys.readouterr().out
    assert not SPHINX.search(out), SPHINX.search(out)
    if args == ["--help"]:
        assert all(name in out for name in ("fit", "validate", "test", "predict")) and "FL_LIGHTNING_DEBUG=1" in out
    elif args == ["fit", "--help"]:
        assert "A Trainer for federated learning: max_epochs is the number of rounds" in out


def test_the_summary_prints_a_long_checkpoint_path_whole_at_80_columns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    main(["fit", "--config", QUICKSTART, "--trainer.max_epochs", "1", "--trainer.enable_progress_bar", "false"]
         + ["--trainer.logger.init_args.name", "a_rather_long_experiment_name_that_runs_past_80_columns"])  # fmt: skip
    output = capsys.readouterr().out
    assert "…" not in output, output
    run = "logs/a_rather_long_experiment_name_that_runs_past_80_columns/version_0"
    assert (tmp_path / run / "checkpoints" / "round_0.ckpt").is_file()
    value_column = "".join(line.split("│")[2].strip() for line in output.splitlines() if line.count("│") == 3)
    assert run in value_column  # the logs row: folded across lines, every character kept
    # The test command is below the table, one line longer than 80 columns (a new-user finding: wrapped, it could
    # not be copied).
    command = f"fl-lightning test --config {run}/config.yaml --ckpt_path {run}/checkpoints/round_0.ckpt"
    assert len(command) > 80 and output.splitlines()[-1] == command


def test_a_dp_run_states_epsilon_at_delta_the_accountant_and_the_relation(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 38 item 9: the budget spent is on every progress line and in the fit summary, not only in metrics.csv."""
    monkeypatch.setenv("COLUMNS", "200")
    main(["fit", "--config", str(ROOT / "configs" / "privacy" / "dp_fedavg_digits.yaml"), "--trainer.max_epochs", "2"]
         + ["--trainer.local_epochs", "1", "--data.init_args.num_clients", "40"])  # fmt: skip
    output = capsys.readouterr().out
    statement = re.compile(r"ε = (\d+(\.\d+)?) at δ = 0\.001 \(PLD, add/remove-one\)")
    rounds = [line for line in output.splitlines() if line.startswith("rounds ")]
    epsilons = [float(statement.search(line).group(1)) for line in rounds if statement.search(line)]
    assert len(epsilons) == len(rounds) == 2 and 0 < epsilons[0] < epsilons[1], output
    summary = [line for line in output.splitlines() if "│ privacy" in line]
    assert len(summary) == 1 and f"ε = {epsilons[1]:.4g} at δ = 0.001 (PLD, add/remove-one)" in summary[0], output
    assert "train_loss" not in output  # an unnoised client statistic, not shown by default (item 8)
