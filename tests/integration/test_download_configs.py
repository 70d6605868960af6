"""Every paper config whose dataset needs a download runs end to end through the CLI, on stand-ins.

The torchvision loader is replaced by random images of the dataset's real shape, layout and
class count (no network, no files), and the CLI shortens the run (2 rounds or aggregations,
1 local epoch or step, a few clients per round): the configs' wiring, not the learning, is under
test, so a config that stops instantiating or running fails here.
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
import yaml

from fl_lightning.cli import FederatedCLI
from fl_lightning.data.datasets import vision

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
DOWNLOADING = sorted(p for p in CONFIGS.rglob("*.yaml") if "download: true" in p.read_text())
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


@pytest.fixture(autouse=True)
def offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["fl-lightning"])
    monkeypatch.setattr(vision, "load_torchvision", stand_in)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def shortened(config: dict[str, Any]) -> list[str]:
    """CLI overrides that keep the config's own settings but make its run tiny."""
    trainer = config["trainer"]
    args = ["--trainer.max_epochs=2", "--trainer.accelerator=cpu", "--trainer.logger=false"]
    args += ["--trainer.enable_progress_bar=false", "--trainer.enable_checkpointing=false"]
    args += ["--trainer.check_val_every_n_epoch=1", "--trainer.limit_val_batches=1"]
    asynchronous = any(name in trainer["algorithm"]["class_path"] for name in ("FedBuff", "FedStaleWeight"))
    if not asynchronous:
        args.append("--trainer.clients_per_round=3")
    if "local_epochs" in trainer:
        args.append("--trainer.local_epochs=1")
    data = config["data"]["init_args"]
    if data["train"]["class_path"].endswith("RotatedMixture"):  # FedSoft: few small clients
        args += ["--data.init_args.num_clients=6", "--data.init_args.train.init_args.num_clients=6"]
        args += ["--data.init_args.train.init_args.samples_per_client=[20, 30]", "--data.init_args.batch_size=32"]
        args.append("--trainer.algorithm.init_args.clients_per_cluster=2")
    return args


def test_every_downloading_config_is_covered():
    names = {p.stem for p in DOWNLOADING}
    assert {"fedstaleweight_cifar10", "fedalign_fmnist", "fedalign_emnist", "fedalign_cifar10", "fedmrn_cifar100"} <= names


@pytest.mark.parametrize("path", DOWNLOADING, ids=[p.stem for p in DOWNLOADING])
def test_config_runs_end_to_end_on_a_stand_in_dataset(path: Path):
    config = yaml.safe_load(path.read_text())
    cli = FederatedCLI(args=["fit", "--config", str(path), *shortened(config)])
    assert cli.trainer.current_epoch == 2
    assert type(cli.trainer.algorithm).__name__ == config["trainer"]["algorithm"]["class_path"].rpartition(".")[2]
    metrics = cli.trainer.callback_metrics
    assert any(key.startswith("val_") for key in metrics), sorted(metrics)
    assert all(torch.isfinite(p).all() for p in cli.model.parameters())
