"""Every paper config whose dataset needs a download runs end to end through the CLI, on stand-ins.

The torchvision loader is replaced by random images of the dataset's real shape, layout and
class count (no network, no files), and the CLI shortens the run (2 rounds or aggregations,
1 local epoch or step, a few clients per round): the configs' wiring, not the learning, is under
test, so a config that stops instantiating or running fails here.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from fl_lightning.cli import FederatedCLI

from .config_runs import DOWNLOADING, check_two_rounds, shortened

pytestmark = pytest.mark.usefixtures("offline")


def test_every_downloading_config_is_covered():
    names = {p.stem for p in DOWNLOADING}
    assert {"fedstaleweight_cifar10", "fedalign_fmnist", "fedalign_emnist", "fedalign_cifar10", "fedmrn_cifar100"} <= names


@pytest.mark.parametrize("path", DOWNLOADING, ids=[p.stem for p in DOWNLOADING])
def test_config_runs_end_to_end_on_a_stand_in_dataset(path: Path):
    config = yaml.safe_load(path.read_text())
    check_two_rounds(FederatedCLI(args=["fit", "--config", str(path), *shortened(config)]), config)
