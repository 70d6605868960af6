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

from ..data.datasets.test_leaf import femnist_user, write_leaf
from .config_runs import CONFIGS, two_rounds

pytestmark = pytest.mark.usefixtures("offline")
DATASET_CONFIGS = sorted((CONFIGS / "datasets").glob("*.yaml"))


def leaf_femnist(root: Path) -> None:
    users = [f"f{i:04d}_00" for i in range(4)]
    write_leaf(root, "train", [{u: femnist_user(i, 12) for i, u in enumerate(users)}])
    write_leaf(root, "test", [{u: femnist_user(10 + i, 3) for i, u in enumerate(users)}])


def leaf_shakespeare(root: Path) -> None:
    rng = np.random.default_rng(0)

    def user(n: int) -> dict[str, list[str]]:
        text = "".join(rng.choice(list(SHAKESPEARE_LETTERS), 80 + n))
        return {"x": [text[i : i + 80] for i in range(n)], "y": [text[80 + i] for i in range(n)]}

    roles = ["HAMLET", "OPHELIA", "POLONIUS", "LAERTES"]
    write_leaf(root, "train", [{r: user(12) for r in roles}])
    write_leaf(root, "test", [{r: user(3) for r in roles}])


#: The fixture writer of each data module, by its class path in the configs.
FIXTURES: dict[str, Callable[[Path], None]] = {
    "fl_lightning.data.LeafFEMNIST": leaf_femnist,
    "fl_lightning.data.LeafShakespeare": leaf_shakespeare,
}


def test_every_dataset_config_has_a_fixture():
    assert {p.stem for p in DATASET_CONFIGS} >= {"leaf_femnist_cnn", "leaf_shakespeare_lstm"}
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
    assert any(key.startswith("test_") for key in metrics), sorted(metrics)  # the paper's per-round test curve
    assert all(np.isfinite(p.detach().numpy()).all() for p in cli.model.parameters())
