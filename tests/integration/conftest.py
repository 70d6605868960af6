"""Shared set-up for end-to-end runs through FederatedTrainer."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from fl_lightning.data import Digits, Dirichlet, FederatedDataModule

from ..quiet import QUIET, quiet_trainer
from .config_runs import run_offline

__all__ = ["QUIET", "digits_data", "quiet_trainer"]


def digits_data(*, num_clients: int = 8, as_image: bool = False, batch_size: int = 16, seed: int = 0) -> FederatedDataModule:
    return FederatedDataModule(
        Digits(split="train", as_image=as_image),
        Digits(split="test", as_image=as_image),
        val_fraction=0.1,
        partitioner=Dirichlet(alpha=0.5),
        num_clients=num_clients,
        batch_size=batch_size,
        seed=seed,
    )


@pytest.fixture
def make_data():
    return digits_data


@pytest.fixture
def make_trainer():
    return quiet_trainer


@pytest.fixture
def offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Shipped configs run in ``tmp_path`` on stand-in datasets (:func:`.config_runs.run_offline`)."""
    yield from run_offline(tmp_path, monkeypatch)
