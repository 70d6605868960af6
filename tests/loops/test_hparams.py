"""The trainer logs the whole federated configuration itself, from the Python API too."""

from __future__ import annotations

import yaml
from lightning.pytorch.loggers import CSVLogger

from fl_lightning import FedProx, ServerSGD
from fl_lightning.models import MLP
from tests.integration.conftest import digits_data, quiet_trainer


def test_hparams_name_the_algorithm_its_nested_arguments_the_partitioner_and_the_local_work(tmp_path) -> None:
    logger = CSVLogger(tmp_path, name="run")
    algorithm = FedProx(mu=0.01, server_optimizer=ServerSGD(lr=0.5, momentum=0.9))
    trainer = quiet_trainer(algorithm=algorithm, logger=logger, clients_per_round=3, local_steps=2, max_epochs=1, seed=4)
    trainer.fit(MLP(in_features=64, hidden=[8]), datamodule=digits_data(num_clients=6))
    hparams = yaml.safe_load((tmp_path / "run" / "version_0" / "hparams.yaml").read_text())
    assert {k: hparams[k] for k in ("fl/algorithm", "fl/algorithm.mu", "fl/algorithm.server_optimizer")} == {
        "fl/algorithm": "FedProx",
        "fl/algorithm.mu": 0.01,
        "fl/algorithm.server_optimizer": "ServerSGD",
    }
    assert (hparams["fl/algorithm.server_optimizer.lr"], hparams["fl/algorithm.server_optimizer.momentum"]) == (0.5, 0.9)
    assert (hparams["fl/data.partitioner"], hparams["fl/data.partitioner.alpha"]) == ("Dirichlet", 0.5)
    assert (hparams["fl/data.train"], hparams["fl/data.batch_size"]) == ("Digits", 16)
    assert {k: hparams[k] for k in ("fl/num_clients", "fl/clients_per_round", "fl/local_steps", "fl/local_epochs", "fl/seed")} == {
        "fl/num_clients": 6,
        "fl/clients_per_round": 3,
        "fl/local_steps": 2,
        "fl/local_epochs": None,
        "fl/seed": 4,
    }
    assert (hparams["fl/client_executor"], hparams["fl/rounds"]) == ("auto", 1)
