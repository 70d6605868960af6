"""Every shipped config that needs no download runs its own federation for 2 rounds through the CLI.

The downloading ones run on stand-ins with fewer clients (``test_download_configs.py``); these
keep their clients per round and data as shipped, so a config that no longer fits its data fails
here (the Pareto device sizes of ``flexible_synthetic.yaml`` once left clients empty after the
server's validation split).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from fl_lightning.cli import FederatedCLI

from .config_runs import DOWNLOADING, RUNNABLE, check_two_rounds, two_rounds

pytestmark = pytest.mark.usefixtures("offline")
LOCAL = [p for p in RUNNABLE if p not in DOWNLOADING]


def test_the_local_configs_include_every_paper():
    names = {p.stem for p in LOCAL}
    assert {"quickstart", "fedalign_digits", "fedstaleweight_digits", "fedsoft_synthetic", "fedmrn_digits"} <= names
    assert {"flexible_synthetic", "fedasync_digits"} <= names


@pytest.mark.parametrize("path", LOCAL, ids=[p.stem for p in LOCAL])
def test_config_runs_two_rounds_as_shipped(path: Path):
    config = yaml.safe_load(path.read_text())
    check_two_rounds(FederatedCLI(args=["fit", "--config", str(path), *two_rounds(config)]), config)
