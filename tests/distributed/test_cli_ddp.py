"""``fl-lightning fit`` with 2 CPU processes (gloo) and the config's CSV logger (issue 15, items 1-2).

It must end cleanly on every rank (the summary once read ``trainer.log_dir``, a broadcast, on
rank 0 alone) and log the metrics of one process (each rank once validated half the set).
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from typing_extensions import override
from lightning.pytorch.loggers import CSVLogger, Logger

from fl_lightning import FederatedTrainer
from fl_lightning.cli import fit_summary, main
from tests.distributed.launch import run_together
from tests.waiting import CEILING

QUICKSTART = str(Path(__file__).resolve().parents[2] / "configs" / "quickstart.yaml")
#: The quickstart, small: 2 rounds of 5 of 10 clients (an uneven 3/2 split over 2 ranks), one local epoch.
TINY = [
    "fit", "--config", QUICKSTART, "--trainer.max_epochs", "2", "--trainer.clients_per_round", "5",
    "--trainer.local_epochs", "1", "--model.init_args.hidden", "[16]", "--data.init_args.num_clients", "10",
    "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
]  # fmt: skip
#: Lightning's DDP strategy with a finite process-group timeout, so that a hang fails.
DDP = {"class_path": "fl_lightning.distributed.FederatedDDPStrategy", "init_args": {"timeout": "0:10:00"}}


def logged_rows(save_dir: Path) -> list[dict[str, str]]:
    """The rows of the CSV logger's ``metrics.csv`` in ``save_dir``, without the wall-clock column."""
    rows = csv.DictReader((save_dir / "quickstart" / "version_0" / "metrics.csv").read_text().splitlines())
    return [{k: v for k, v in row.items() if k != "round/wall_time_s"} for row in rows]


@pytest.fixture(autouse=True)
def cli_argv(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", ["fl-lightning"])  # pytest's own arguments are not the CLI's


def test_two_process_fit_exits_cleanly_and_logs_the_metrics_of_one(tmp_path):
    main([*TINY, "--trainer.logger.init_args.save_dir", str(tmp_path / "one")])
    command = [sys.executable, "-m", "fl_lightning.cli", *TINY, "--trainer.devices", "2", "--trainer.strategy", json.dumps(DDP)]
    (output,) = run_together([[*command, "--trainer.logger.init_args.save_dir", "two"]], cwd=tmp_path, timeout=CEILING)

    assert "Traceback" not in output  # rank 1 too: its exit status is not rank 0's
    assert "sync_dist=True" not in output  # Lightning's advice, which federated DDP does not need
    assert output.count("Federated fit summary") == 1  # printed by rank 0 only
    assert str(Path("two", "quickstart", "version_0")) in output  # the summary's log directory
    one, two = logged_rows(tmp_path / "one"), logged_rows(tmp_path / "two")
    assert sum(bool(row["val_loss"]) for row in one) == 2
    assert [row.keys() for row in two] == [row.keys() for row in one]
    for row_one, row_two in zip(one, two):
        assert [k for k, v in row_two.items() if v] == [k for k, v in row_one.items() if v]
        for key, value in row_one.items():
            if value:
                assert float(row_two[key]) == pytest.approx(float(value), rel=1e-6, abs=1e-6), key


class DirectoryLogger(Logger):
    """A logger that is neither CSV nor TensorBoard: ``Trainer.log_dir`` is its ``save_dir``."""

    def __init__(self, save_dir: Path) -> None:
        super().__init__()
        self._save_dir = str(save_dir)

    @property
    @override
    def name(self) -> str:
        return "directory"

    @property
    @override
    def version(self) -> int:
        return 0

    @property
    @override
    def save_dir(self) -> str:
        return self._save_dir

    @override
    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        pass

    @override
    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        pass


@pytest.mark.parametrize(
    ("make_logger", "expected"),
    # Another logger's run has its own folder too, where its checkpoints go: <save_dir>/<name>/<version>.
    [(lambda root: CSVLogger(root, name="run"), "run/version_0"), (DirectoryLogger, "directory/version_0")],
    ids=["csv", "other"],
)
def test_the_summary_reads_the_log_dir_without_a_collective(tmp_path, monkeypatch, make_logger, expected):
    trainer = FederatedTrainer(logger=make_logger(tmp_path), accelerator="cpu", enable_progress_bar=False)

    def collective(*args: object, **kwargs: object) -> None:
        raise AssertionError("the summary must not broadcast: only rank 0 prints it")

    monkeypatch.setattr(trainer.strategy, "broadcast", collective)
    table = fit_summary(trainer, wall_time_s=1.0)
    logs = dict(zip(table.columns[0].cells, table.columns[1].cells))["logs"]
    assert logs == str(tmp_path / expected)


def test_the_cli_leaves_the_distributed_sampler_off(capsys):
    # LightningCLI passes every Trainer argument explicitly: its default must be the trainer's own.
    with pytest.raises(SystemExit):
        main(["fit", "--config", QUICKSTART, "--print_config"])
    assert yaml.safe_load(capsys.readouterr().out)["trainer"]["use_distributed_sampler"] is False
