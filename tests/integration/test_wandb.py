"""Weights & Biases, offline: round metrics, model hyper-parameters, federated settings and the CLI's
resolved config all reach the run, read back from the run's transaction log."""

from __future__ import annotations

import json
import struct
import sys
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

wandb = pytest.importorskip("wandb")
from lightning.pytorch.loggers import WandbLogger  # noqa: E402
from wandb.proto import wandb_internal_pb2  # noqa: E402

from fl_lightning.cli import main  # noqa: E402
from fl_lightning.models import MLP  # noqa: E402

QUICKSTART = str(Path(__file__).resolve().parents[2] / "configs" / "quickstart.yaml")

# The .wandb transaction log is LevelDB's log format: a 7-byte file header, then 32 KiB blocks
# of records, each with a 7-byte header (CRC-32 of type + data, length, type) and a chunk of a
# serialised `Record`. wandb 0.31 writes neither config.yaml nor wandb-summary.json for an
# offline run, and no longer ships a Python reader for the log.
_FILE_HEADER = struct.Struct("<4sHB")
_RECORD_HEADER = struct.Struct("<IHB")
_BLOCK = 32768
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def _records(path: Path) -> Iterator[Any]:
    data = path.read_bytes()
    ident, magic, _ = _FILE_HEADER.unpack_from(data)
    assert (ident, magic) == (b":W&B", 0xBEE1), f"{path} is not a W&B transaction log"
    pos, chunks = _FILE_HEADER.size, []
    while pos + _RECORD_HEADER.size <= len(data):
        if _BLOCK - pos % _BLOCK < _RECORD_HEADER.size:  # a block's tail too short for a header is padding
            pos += _BLOCK - pos % _BLOCK
            continue
        crc, length, kind = _RECORD_HEADER.unpack_from(data, pos)
        if kind == 0:  # zero padding at the end of the file
            break
        chunk = data[pos + _RECORD_HEADER.size : pos + _RECORD_HEADER.size + length]
        assert zlib.crc32(bytes([kind]) + chunk) == crc, f"corrupt record at byte {pos} of {path}"
        pos += _RECORD_HEADER.size + length
        chunks.append(chunk)
        if kind in (_FULL, _LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(b"".join(chunks))
            chunks = []
            yield record


def _key(item: Any) -> str:
    return item.key or "/".join(item.nested_key)


@dataclass
class OfflineRun:
    project: str = ""
    group: str = ""
    config: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)

    def steps(self, key: str) -> list[int]:
        """The ``trainer/global_step`` (the round) of every history row that has ``key``."""
        return [row["trainer/global_step"] for row in self.history if key in row]


def finish_offline_run() -> None:
    """Finishes the run and waits until its log is on disk.

    ``wandb.finish()`` only informs the wandb-core service that the run ended; the service
    closes the run's log afterwards. ``teardown`` waits for the service to shut down.
    """
    wandb.finish()
    wandb.teardown()


def read_offline_run(wandb_dir: Path) -> OfflineRun:
    (path,) = wandb_dir.glob("offline-run-*/run-*.wandb")
    run = OfflineRun()
    for record in _records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run.project, run.group = record.run.project, record.run.run_group
            run.config.update({_key(i): json.loads(i.value_json) for i in record.run.config.update})
        elif kind == "config":
            run.config.update({_key(i): json.loads(i.value_json) for i in record.config.update})
            for item in record.config.remove:
                run.config.pop(_key(item), None)
        elif kind == "history":
            run.history.append({_key(i): json.loads(i.value_json) for i in record.history.item})
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
    # One point per round, with the round as the step.
    assert run.steps("round/clients") == [0, 1]
    assert [row["round/clients"] for row in run.history if "round/clients" in row] == [3, 3]
    assert run.steps("round/upload_bytes") == [0, 1]
    assert run.steps("val_acc") == [0, 1]
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
    assert run.steps("round/clients") == [0, 1]
    assert run.steps("val_acc") == [0, 1]
