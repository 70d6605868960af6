"""Weights & Biases, offline: round metrics, model hyper-parameters, federated settings and the CLI's
resolved config all reach the run, read back from the run's transaction log."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest
import yaml

wandb = pytest.importorskip("wandb")
from lightning.pytorch.loggers import WandbLogger  # noqa: E402

from fl_lightning import cli as cli_module  # noqa: E402
from fl_lightning.cli import main  # noqa: E402
from fl_lightning.models import MLP  # noqa: E402

from ..wandb_offline import OfflineRun, offline_runs  # noqa: E402

QUICKSTART = str(Path(__file__).resolve().parents[2] / "configs" / "quickstart.yaml")

def finish_offline_run() -> None:
    """Finishes the run and waits until its log is on disk.

    ``wandb.finish()`` only informs the wandb-core service that the run ended; the service
    closes the run's log afterwards. ``teardown`` waits for the service to shut down.
    """
    wandb.finish()
    wandb.teardown()


def read_offline_run(wandb_dir: Path) -> OfflineRun:
    (run,) = offline_runs(wandb_dir)
    return run


@pytest.fixture
def offline_wandb(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Offline W&B writing only under ``tmp_path``; yields the directory that holds the runs."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["fl-lightning"])
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    for variable, folder in (("WANDB_CONFIG_DIR", "config"), ("WANDB_CACHE_DIR", "cache"), ("WANDB_DATA_DIR", "data")):
        monkeypatch.setenv(variable, str(tmp_path / folder))
    try:
        yield tmp_path / "wandb"
    finally:
        finish_offline_run()  # also when the test failed, so that no run leaks into the next test


def test_federated_trainer_logs_rounds_and_settings_to_wandb(offline_wandb, make_data, make_trainer):
    logger = WandbLogger(save_dir=offline_wandb.parent, offline=True, project="fl-test", group="FedAvg")
    trainer = make_trainer(logger=logger, max_epochs=2, clients_per_round=3)
    trainer.fit(MLP(in_features=64, hidden=(32,), lr=0.1), datamodule=make_data())
    finish_offline_run()

    run = read_offline_run(offline_wandb)
    assert (run.project, run.group) == ("fl-test", "FedAvg")
    # The model's hyper-parameters, and the federated settings beside them.
    assert {k: run.config.get(k) for k in ("in_features", "hidden", "num_classes", "lr")} == {
        "in_features": 64,
        "hidden": [32],
        "num_classes": 10,
        "lr": 0.1,
    }
    assert run.config["fl/algorithm"] == "FedAvg"
    assert (run.config["fl/num_clients"], run.config["fl/clients_per_round"]) == (8, 3)
    # One point per round, plotted against the round.
    for key in ("round/clients", "round/upload_bytes", "val_acc"):
        assert run.rounds(key) == [0, 1], key
        assert run.step_metrics[key] == "round", key
    assert [row["round/clients"] for row in run.history if "round/clients" in row] == [3, 3]
    steps = run.steps("round/clients")
    assert 0 < steps[0] < steps[1]  # the trainer's step counts optimizer steps over all clients
    assert all(0.0 <= row["val_acc"] <= 1.0 for row in run.history if "val_acc" in row)


def test_cli_sends_the_resolved_config_to_wandb(offline_wandb, capsys):
    overlay = offline_wandb.parent / "wandb_logger.yaml"
    overlay.write_text(
        yaml.safe_dump(
            {
                "trainer": {
                    "logger": {
                        "class_path": "lightning.pytorch.loggers.WandbLogger",
                        "init_args": {
                            "save_dir": str(offline_wandb.parent),
                            "offline": True,
                            "project": "fl-test",
                            "group": "FedAvg",
                        },
                    }
                }
            }
        )
    )
    main(
        ["fit", "--config", QUICKSTART, "--config", str(overlay)]
        + ["--trainer.max_epochs", "2", "--trainer.enable_progress_bar", "false"]
    )
    assert "Federated fit summary" in capsys.readouterr().out
    finish_offline_run()

    run = read_offline_run(offline_wandb)
    assert (run.project, run.group) == ("fl-test", "FedAvg")
    config = run.config
    resolved = config["config"]  # the CLI's resolved config, nested apart from the model's hparams
    # The resolved config, section by section, defaults included.
    trainer = resolved["trainer"]
    assert trainer["max_epochs"] == 2 and trainer["clients_per_round"] == 10 and trainer["local_epochs"] == 2
    assert trainer["algorithm"]["class_path"] == "fl_lightning.FedAvg"
    assert trainer["algorithm"]["init_args"]["weighting"] == "samples"
    assert trainer["logger"]["class_path"] == "lightning.pytorch.loggers.WandbLogger"
    assert resolved["model"]["class_path"] == "fl_lightning.models.MLP"
    assert resolved["model"]["init_args"]["lr"] == 0.1 and resolved["model"]["init_args"]["hidden"] == [128]
    data = resolved["data"]["init_args"]
    assert resolved["data"]["class_path"] == "fl_lightning.data.FederatedDataModule"
    assert data["partitioner"]["class_path"] == "fl_lightning.data.Dirichlet" and data["num_clients"] == 20
    assert data["train"]["class_path"] == "fl_lightning.data.Digits"
    assert resolved["seed_everything"] == 0
    assert config["optimizer"] == "sgd"  # the model's hyper-parameter, no longer overwritten by the CLI's
    # Lightning's own hyper-parameter logging and the federated settings.
    assert config["in_features"] == 64 and config["hidden"] == [128] and config["lr"] == 0.1
    assert config["fl/algorithm"] == "FedAvg" and config["fl/num_clients"] == 20
    assert run.rounds("round/clients") == [0, 1]
    assert run.rounds("val_acc") == [0, 1]


def test_cli_runs_of_one_config_get_their_own_names_and_config_files(offline_wandb, monkeypatch):
    overlay = offline_wandb.parent / "wandb_logger.yaml"
    init_args = {"save_dir": str(offline_wandb.parent), "offline": True, "project": "fl-test", "name": "quickstart"}
    logger = {"class_path": "lightning.pytorch.loggers.WandbLogger", "init_args": init_args}
    overlay.write_text(yaml.safe_dump({"trainer": {"logger": logger}}))
    args = ["fit", "--config", QUICKSTART, "--config", str(overlay), "--trainer.max_epochs", "1"]
    args += ["--trainer.enable_progress_bar", "false"]
    starts = iter([datetime(2026, 11, 26, 0, 45, 12), datetime(2026, 11, 26, 0, 46, 3)])

    class Clock(datetime):
        @classmethod
        def now(cls, tz: object = None) -> datetime:
            return next(starts)

    monkeypatch.setattr(cli_module, "datetime", Clock)
    for _ in range(2):
        main(args)
        finish_offline_run()

    runs = offline_runs(offline_wandb)
    assert sorted(run.name for run in runs) == ["quickstart-20261126-004512", "quickstart-20261126-004603"]
    # Each run's config beside its checkpoints, <save_dir>/<project>/<run id>/, none shared in save_dir.
    configs = sorted((offline_wandb.parent / "fl-test").glob("*/config.yaml"))
    names = [yaml.safe_load(path.read_text())["trainer"]["logger"]["init_args"]["name"] for path in configs]
    assert sorted(names) == sorted(run.name for run in runs)
    assert not (offline_wandb.parent / "config.yaml").exists()
