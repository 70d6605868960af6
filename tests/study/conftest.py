"""A tiny federated config and an offline, sandboxed environment for study tests."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]

# 4 clients of digits, 2 per round, 4 local steps, 3 rounds: about a second of training.
TINY: dict[str, Any] = {
    "seed_everything": 0,
    "trainer": {
        "max_epochs": 3,
        "clients_per_round": 2,
        "local_steps": 4,
        "accelerator": "cpu",
        "enable_model_summary": False,
        "num_sanity_val_steps": 0,
        "algorithm": {"class_path": "fl_lightning.FedAvg"},
    },
    "model": {
        # Logs val/acc and val/nll: the study reports the module's own names.
        "class_path": "tests.slash_named.SlashNamedMLP",
        "init_args": {"in_features": 64, "hidden": [32], "num_classes": 10, "lr": 0.3},
    },
    "data": {
        "class_path": "fl_lightning.data.FederatedDataModule",
        "init_args": {
            "train": {"class_path": "fl_lightning.data.Digits", "init_args": {"split": "train"}},
            "test": {"class_path": "fl_lightning.data.Digits", "init_args": {"split": "test"}},
            "val_fraction": 0.1,
            "partitioner": {"class_path": "fl_lightning.data.Dirichlet", "init_args": {"alpha": 0.5}},
            "num_clients": 4,
            "batch_size": 32,
            "seed": 0,
        },
    },
}


@pytest.fixture
def study_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Runs in ``tmp_path`` with a tiny ``base.yaml``; W&B offline and confined to ``tmp_path``.

    The study's ``fl-lightning fit`` processes inherit the environment: one thread each, and
    this checkout (with ``tests``) on their path.
    """
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["fl-lightning-compare"])
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    for variable, folder in (
        ("WANDB_CONFIG_DIR", "wandb_config"),
        ("WANDB_CACHE_DIR", "wandb_cache"),
        ("WANDB_DATA_DIR", "wandb_data"),
    ):
        monkeypatch.setenv(variable, str(tmp_path / folder))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(TINY, sort_keys=False))
    return tmp_path


@pytest.fixture
def write_study(study_env: Path) -> Callable[..., Path]:
    """Writes ``study.yaml`` (on ``base.yaml``) from keyword fields; returns its path."""

    def write(**fields: Any) -> Path:
        path = study_env / "study.yaml"
        path.write_text(yaml.safe_dump({"base": "base.yaml", "plots": True, **fields}, sort_keys=False))
        return path

    return write
