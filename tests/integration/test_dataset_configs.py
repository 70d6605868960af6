"""Every config of ``configs/datasets`` runs 2 rounds through the CLI on a tiny fixture in its source's exact
file format, written where the config looks for its data (a few clients, a few samples each)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import yaml

from fl_lightning.cli import FederatedCLI
from fl_lightning.data.datasets.leaf import SHAKESPEARE_LETTERS

from ..data.datasets.flair_files import write_flair_splits
from ..data.datasets.test_leaf import femnist_user, shakespeare_all_data, split_like_leaf, write_leaf
from ..data.datasets.test_tff import emnist_examples
from ..data.datasets.tff_files import write_stackoverflow_counts, write_tff_sqlite
from .config_runs import CONFIGS, two_rounds

pytestmark = pytest.mark.usefixtures("offline")
DATASET_CONFIGS = sorted((CONFIGS / "datasets").glob("*.yaml"))


def leaf_femnist(root: Path) -> None:
    users = [f"f{i:04d}_00" for i in range(4)]
    write_leaf(root, "train", [{u: femnist_user(i, 12) for i, u in enumerate(users)}])
    write_leaf(root, "test", [{u: femnist_user(10 + i, 3) for i, u in enumerate(users)}])


def leaf_shakespeare(root: Path) -> None:
    """Split as LEAF's own ``split_data.py`` splits it (``--tf 0.5``): each test user's ``num_samples`` is 79
    above the windows its test file holds."""
    rng = np.random.default_rng(0)
    roles = {r: "".join(rng.choice(list(SHAKESPEARE_LETTERS), 80 + 200)) for r in ("HAMLET", "OPHELIA", "POLONIUS", "LAERTES")}
    split_like_leaf(root, "shakespeare", shakespeare_all_data(roles), frac=0.5)


CLIENTS = ["c0", "c1", "c2", "c3"]


def tff_emnist(root: Path) -> None:
    root.mkdir(parents=True)
    splits = {"all_train": 12, "all_test": 3}
    write_tff_sqlite(
        root / "emnist_all.sqlite",
        {split: {c: emnist_examples(10 * i + len(split), n) for i, c in enumerate(CLIENTS)} for split, n in splits.items()},
    )


def tff_shakespeare(root: Path) -> None:
    root.mkdir(parents=True)
    line = b"To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer the slings."
    write_tff_sqlite(
        root / "shakespeare.sqlite",
        {split: {c: [{"snippets": [line]}] * n for c in CLIENTS} for split, n in (("train", 3), ("test", 1))},
    )


def tff_stackoverflow(root: Path) -> None:
    root.mkdir(parents=True)
    (root / "stackoverflow.word_count").write_text("".join(f"w{i} {10_000 - i}\n" for i in range(10_000)))
    post = {"tokens": [b"w1 w2 unknown w3 w9999 w4"], "title": [b"t"], "tags": [b"python"]}
    splits = {"train": 12, "heldout": 2, "test": 2}
    write_tff_sqlite(root / "stackoverflow.sqlite", {s: {c: [post] * n for c in CLIENTS} for s, n in splits.items()})


def tff_stackoverflow_tags(root: Path) -> None:
    tff_stackoverflow(root)  # its posts are tagged "python"
    words = {f"w{i}": 10_000 - i for i in range(10_000)}
    write_stackoverflow_counts(root, words, {"python": 1000, **{f"t{i}": 999 - i for i in range(600)}})


def tff_cifar100(root: Path) -> None:
    root.mkdir(parents=True)
    rng = np.random.default_rng(0)

    def examples(n: int) -> list[dict[str, object]]:
        return [{"coarse_label": [0], "image": rng.integers(0, 256, 32 * 32 * 3), "label": [int(rng.integers(100))]} for _ in range(n)]

    write_tff_sqlite(root / "cifar100.sqlite", {"train": {c: examples(6) for c in CLIENTS}, "test": {"0": examples(4)}})


#: The fixture writer of each data module, by its class path in the configs.
FIXTURES: dict[str, Callable[[Path], None]] = {
    "fl_lightning.data.LeafFEMNIST": leaf_femnist,
    "fl_lightning.data.LeafShakespeare": leaf_shakespeare,
    "fl_lightning.data.datasets.tff.TffEMNIST": tff_emnist,
    "fl_lightning.data.datasets.tff.TffShakespeare": tff_shakespeare,
    "fl_lightning.data.datasets.tff.TffStackOverflow": tff_stackoverflow,
    "fl_lightning.data.datasets.tff.TffCIFAR100": tff_cifar100,
    "fl_lightning.data.datasets.tff_stackoverflow_tags.TffStackOverflowTags": tff_stackoverflow_tags,
    # pfl-research's HDF5 layout: 4 training users, 2 validation and 2 test users, 8x8 images.
    "fl_lightning.data.datasets.flair.Flair": write_flair_splits,
}


def test_every_dataset_config_has_a_fixture():
    assert {p.stem for p in DATASET_CONFIGS} >= {"leaf_femnist_cnn", "leaf_shakespeare_lstm", "reddi_emnist_cnn"}
    stems = {"reddi_shakespeare_lstm", "reddi_stackoverflow_nwp", "reddi_stackoverflow_lr", "reddi_cifar100_resnet18", "pfl_flair_resnet18"}
    assert stems <= {p.stem for p in DATASET_CONFIGS}
    assert {yaml.safe_load(p.read_text())["data"]["class_path"] for p in DATASET_CONFIGS} <= set(FIXTURES)


@pytest.mark.parametrize("path", DATASET_CONFIGS, ids=[p.stem for p in DATASET_CONFIGS])
def test_config_runs_two_rounds_on_its_fixture(path: Path, tmp_path: Path):
    config = yaml.safe_load(path.read_text())
    data = config["data"]
    FIXTURES[data["class_path"]](tmp_path / data["init_args"]["root"])
    args = [*two_rounds(config), "--trainer.clients_per_round=2", "--trainer.limit_test_batches=1"]
    cli = FederatedCLI(args=["fit", "--config", str(path), *args])
    assert cli.trainer.current_epoch == 2
    assert type(cli.trainer.algorithm).__name__ == config["trainer"]["algorithm"]["class_path"].rpartition(".")[2]
    metrics = cli.trainer.callback_metrics
    # The paper's per-round test curve (TestCurve), or Stack Overflow's held-out validation.
    assert any(key.startswith(("test_", "val_")) for key in metrics), sorted(metrics)
    assert all(np.isfinite(p.detach().numpy()).all() for p in cli.model.parameters())
