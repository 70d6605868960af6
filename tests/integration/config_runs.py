"""Running the shipped configs in tests: stand-in datasets for the downloading ones and short-run CLI overrides.

The torchvision loader is replaced by random images of the dataset's real shape, layout and
class count (no network, no files); the overrides keep a config's own wiring and shorten its run.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

from fl_lightning.cli import FederatedCLI
from fl_lightning.data.datasets import vision

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
#: Every config ``fl-lightning fit`` runs (the studies are ``fl-lightning-compare``'s; the natural-partition
#: configs of ``configs/datasets`` run on file fixtures in ``test_dataset_configs.py``).
#: A config that loads a hub model (``model_name:``) needs the internet: only parsed (``test_cli.py``), never run.
RUNNABLE = sorted(
    p
    for p in CONFIGS.rglob("*.yaml")
    if {"studies", "datasets"}.isdisjoint(p.relative_to(CONFIGS).parts) and "model_name:" not in p.read_text()
)
DOWNLOADING = [p for p in RUNNABLE if "download: true" in p.read_text()]
#: (raw image shape, layout) per torchvision class, as torchvision stores them.
SHAPES = {
    "MNIST": ((28, 28), "torch"),
    "FashionMNIST": ((28, 28), "torch"),
    "EMNIST": ((28, 28), "torch"),
    "CIFAR10": ((32, 32, 3), "numpy"),
    "CIFAR100": ((32, 32, 3), "numpy"),
    "SVHN": ((3, 32, 32), "svhn"),
}
CLASSES = {"CIFAR100": 100, "EMNIST": 47}  # EMNIST: the most classes of any split the configs use
TRAIN, TEST = 3000, 50


def stand_in(name: str, *, root: str, download: bool, **kwargs: Any) -> SimpleNamespace:
    """Random ``uint8`` images and balanced labels in torchvision's own layout for ``name``."""
    shape, layout = SHAPES[name]
    train = kwargs.get("train", kwargs.get("split", "train") in ("train", True))
    size = TRAIN if train else TEST
    classes = {"letters": 27, "digits": 10, "mnist": 10}.get(kwargs.get("split", ""), CLASSES.get(name, 10))
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (size, *shape), dtype=np.uint8)
    labels = rng.permutation(np.arange(size) % classes)
    if name == "EMNIST" and kwargs.get("split") == "letters":
        labels = labels % 26 + 1  # torchvision's letters labels are 1..26
    if layout == "torch":
        return SimpleNamespace(data=torch.from_numpy(images), targets=torch.from_numpy(labels))
    if layout == "svhn":
        return SimpleNamespace(data=images, labels=labels)
    return SimpleNamespace(data=images, targets=labels.tolist())


def run_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """In ``tmp_path``, with the stand-in datasets and one torch thread (a fixture's body)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["fl-lightning"])
    monkeypatch.setattr(vision, "load_torchvision", stand_in)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def two_rounds(config: dict[str, Any], accelerator: str = "cpu") -> list[str]:
    """CLI overrides that keep the config's own federation but run 2 rounds of 1 local epoch, validating each."""
    args = ["--trainer.max_epochs=2", f"--trainer.accelerator={accelerator}", "--trainer.logger=false"]
    args += ["--trainer.enable_progress_bar=false", "--trainer.enable_checkpointing=false"]
    args += ["--trainer.check_val_every_n_epoch=1", "--trainer.limit_val_batches=1"]
    if "local_epochs" in config["trainer"]:
        args.append("--trainer.local_epochs=1")
    return args


def shortened(config: dict[str, Any]) -> list[str]:
    """:func:`two_rounds`, with few clients per round and, for FedSoft, few small clients: a tiny run."""
    trainer = config["trainer"]
    args = two_rounds(config)
    asynchronous = any(name in trainer["algorithm"]["class_path"] for name in ("FedBuff", "FedStaleWeight"))
    if not asynchronous:
        args.append("--trainer.clients_per_round=3")
    data = config["data"]["init_args"]
    if data["train"]["class_path"].endswith("RotatedMixture"):  # FedSoft: few small clients
        args += ["--data.init_args.num_clients=6", "--data.init_args.train.init_args.num_clients=6"]
        args += ["--data.init_args.train.init_args.samples_per_client=[20, 30]", "--data.init_args.batch_size=32"]
        args.append("--trainer.algorithm.init_args.clients_per_cluster=2")
    return args


def check_two_rounds(cli: FederatedCLI, config: dict[str, Any], device: str = "cpu") -> None:
    """The run of :func:`two_rounds` finished its 2 rounds on ``device`` with the config's algorithm, validated, finite weights."""
    assert cli.trainer.current_epoch == 2
    assert type(cli.trainer.algorithm).__name__ == config["trainer"]["algorithm"]["class_path"].rpartition(".")[2]
    metrics = cli.trainer.callback_metrics
    assert any(key.startswith("val_") for key in metrics), sorted(metrics)
    assert cli.trainer.strategy.root_device.type == device  # Lightning moves the model back to the CPU after fit
    assert all(torch.isfinite(p).all() for p in cli.model.parameters())
