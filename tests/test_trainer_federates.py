"""FederatedTrainer federates a plain LightningDataModule it is given (``tests/integration/test_cli_federated.py``: under a CLI)."""

from __future__ import annotations

import logging

import pytest

from fl_lightning import FederatedTrainer
from fl_lightning.data import Dirichlet, Federated
from tests.data.user_project import UserDataModule, UserModule
from tests.quiet import QUIET as QUIET_SETTINGS

QUIET = {**QUIET_SETTINGS, "max_epochs": 1}


def test_a_plain_datamodule_is_federated_iid_over_ten_clients_by_default(caplog: pytest.LogCaptureFixture) -> None:
    model = UserModule()
    trainer = FederatedTrainer(seed=3, **QUIET)
    with caplog.at_level(logging.INFO):
        trainer.fit(model, datamodule=UserDataModule())
    data = trainer.datamodule
    assert isinstance(data, Federated) and (data.num_clients, data.seed, repr(data.partitioner)) == (10, 3, "IID()")
    assert "FederatedTrainer federates UserDataModule: IID() over 10 clients (seed 3)" in caplog.text
    # 4 samples per client, one batch of 4 each (drop_last keeps it whole).
    assert model.trained == [4] * 10 and trainer.fit_loop.history == [list(range(10))]


def test_the_trainer_can_be_told_how_to_federate() -> None:
    trainer = FederatedTrainer(num_clients=4, partitioner=Dirichlet(alpha=0.5), **QUIET)
    trainer.fit(UserModule(), datamodule=UserDataModule())
    expected = Federated(UserDataModule(), num_clients=4, partitioner=Dirichlet(alpha=0.5))
    assert [trainer.datamodule.client_indices(c).tolist() for c in range(4)] == [
        expected.client_indices(c).tolist() for c in range(4)
    ]

