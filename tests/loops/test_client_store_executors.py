"""Per-client state under every client executor: the lean and batched executors run the algorithm's hooks per
client as Lightning's loop does, so a stateful algorithm's store and weights are the same under each."""

from __future__ import annotations

import os

import torch
from lightning.pytorch.loggers import CSVLogger

from fl_lightning import FedAvg, FederatedTrainer
from fl_lightning.data import Digits, Dirichlet, FederatedDataModule
from fl_lightning.models import MLP
from tests.algorithms.stateful import RunningMeanFedAvg
from tests.quiet import QUIET as QUIET_SETTINGS


def fit(algorithm, executor: str, **kwargs):
    torch.manual_seed(0)
    model = MLP(in_features=64, hidden=(16,), lr=0.1)
    data = FederatedDataModule(Digits(split="train"), partitioner=Dirichlet(alpha=0.5), num_clients=6, batch_size=16)
    settings = {"algorithm": algorithm, "clients_per_round": 3, "max_epochs": 4, "local_epochs": 1, "seed": 1}
    trainer = FederatedTrainer(**{**QUIET_SETTINGS, **settings, "client_executor": executor, "limit_val_batches": 0, **kwargs})
    trainer.fit(model, datamodule=data)
    return {k: v.clone() for k, v in trainer.fit_loop.global_state.items()}, trainer


def test_a_stateful_algorithm_gives_the_same_weights_and_state_under_every_executor(tmp_path):
    lightning, trainer = fit(RunningMeanFedAvg(), "lightning")
    store = trainer.algorithm.sums
    trained = sorted({c for clients in trainer.fit_loop.history for c in clients})
    assert store.ids() == trained and any(int(s["count"]) > 1 for _, s in store.items())  # clients came back
    stateless, _ = fit(FedAvg(), "lightning")
    assert any(not torch.equal(lightning[k], stateless[k]) for k in lightning)  # the store decides the updates

    for executor in ("lean", "batched"):
        weights, other = fit(RunningMeanFedAvg(), executor, client_state_memory=0, default_root_dir=tmp_path / executor)
        for name in lightning:
            torch.testing.assert_close(weights[name], lightning[name], rtol=0, atol=1e-6, msg=f"{executor}: {name}")
        assert other.algorithm.sums.resident_nbytes() == 0  # everything went through the disk
        for (cid, a), (_, b) in zip(other.algorithm.sums.items(), store.items()):
            assert int(a["count"]) == int(b["count"]), cid


def test_entries_spill_into_the_experiment_folder_which_a_resumed_run_shares(tmp_path):
    _, trainer = fit(RunningMeanFedAvg(), "lean", client_state_memory=0, logger=CSVLogger(tmp_path, name="run"))
    folder = trainer.algorithm.sums.spill_folder
    assert folder is not None and folder.startswith(str(tmp_path / "run" / "client_state-"))
    assert sorted(os.listdir(folder)) == [".lock", "entries.bin"]


def test_without_a_logger_entries_spill_under_the_root_folder_not_the_system_temporary_one(tmp_path):
    _, trainer = fit(RunningMeanFedAvg(), "lean", client_state_memory=0, logger=False, default_root_dir=tmp_path)
    assert trainer.algorithm.sums.spill_folder.startswith(str(tmp_path / "client_state-"))
