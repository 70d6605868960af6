"""Every bad input of FederatedTrainer fails early, with a message that names the value."""

from __future__ import annotations

import re

from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from fl_lightning import FedAvg, FederatedTrainer
from fl_lightning.data import FederatedDataModule, InMemoryDataset
from fl_lightning.models import LogisticRegression

from .quiet import QUIET as QUIET_SETTINGS

QUIET: dict[str, Any] = {**QUIET_SETTINGS, "max_epochs": 2}
NUM_CLIENTS = 4


def _data() -> FederatedDataModule:
    g = torch.Generator().manual_seed(0)
    train = InMemoryDataset(inputs=torch.randn(16, 3, generator=g), labels=torch.randint(0, 2, (16,), generator=g), num_classes=2)
    test = InMemoryDataset(inputs=torch.randn(4, 3, generator=g), labels=torch.randint(0, 2, (4,), generator=g), num_classes=2)
    return FederatedDataModule(train, test, num_clients=NUM_CLIENTS, batch_size=4)


class _CountingModel(LogisticRegression):
    def __init__(self) -> None:
        super().__init__(in_features=3, num_classes=2, lr=0.1)
        self.steps = 0
        self.train_started = False

    def on_train_start(self) -> None:
        self.train_started = True

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.steps += 1
        return super().training_step(batch, batch_idx)


def _fit_fails_before_training(trainer: FederatedTrainer, exc: type[Exception], match: str, **fit_kwargs: Any) -> None:
    model = _CountingModel()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(exc, match=match):
        trainer.fit(model, **({"datamodule": _data()} | fit_kwargs))
    assert model.steps == 0 and not model.train_started
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_local_epochs_and_local_steps_are_exclusive() -> None:
    with pytest.raises(
        ValueError,
        match=r"Set either `local_epochs` or `local_steps`, not both \(got local_epochs=2, local_steps=5\)\.",
    ):
        FederatedTrainer(local_epochs=2, local_steps=5, **QUIET)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"local_steps": 0}, r"`local_steps` must be a positive integer, got 0\."),
        ({"local_steps": -3}, r"`local_steps` must be a positive integer, got -3\."),
        ({"local_steps": 2.5}, r"`local_steps` must be a positive integer, got 2\.5\."),
        ({"local_steps": True}, r"`local_steps` must be a positive integer, got True\."),
        ({"local_epochs": 0}, r"`local_epochs` must be a positive integer, got 0\."),
        ({"local_epochs": "1"}, r"`local_epochs` must be a positive integer, got '1'\."),
    ],
)
def test_bad_local_work(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        FederatedTrainer(**kwargs, **QUIET)


@pytest.mark.parametrize("value", [0, -1, 0.0, -0.5, True, "10", None])
def test_bad_clients_per_round_in_constructor(value: Any) -> None:
    with pytest.raises(
        ValueError, match=rf"`clients_per_round` must be a positive count or a fraction in \(0, 1\], got {value!r}\."
    ):
        FederatedTrainer(clients_per_round=value, **QUIET)


def test_seed_out_of_range_or_not_an_integer() -> None:
    with pytest.raises(ValueError, match=r"`seed` must be an integer in \[0, 18446744073709551615\], got -1\."):
        FederatedTrainer(seed=-1, **QUIET)
    for seed in ("0", 1.0, True, 2**64):  # a config's quoted number, a float, a bool, past derive_seed's range
        with pytest.raises(ValueError, match=rf"`seed` must be an integer .*got {re.escape(repr(seed))}\."):
            FederatedTrainer(seed=seed, **QUIET)


@pytest.mark.parametrize("value", [True, 1, "true"])
def test_distributed_sampler_cannot_be_turned_on(value: Any) -> None:
    # It would split the server's evaluation data across ranks: metrics would differ from one process's.
    with pytest.raises(ValueError, match=rf"`use_distributed_sampler` must be False under FederatedTrainer, got {value!r}"):
        FederatedTrainer(use_distributed_sampler=value, **QUIET)


def test_asynchronous_algorithm_must_be_buffered() -> None:
    class AsyncFedAvg(FedAvg):
        asynchronous = True

    trainer = FederatedTrainer(algorithm=AsyncFedAvg(), **QUIET)
    _fit_fails_before_training(trainer, TypeError, r"AsyncFitLoop runs buffered asynchronous algorithms .* got AsyncFedAvg")


def test_fraction_above_one_fails_at_construction() -> None:
    with pytest.raises(ValueError, match=r"`clients_per_round` must be a positive count or a fraction in \(0, 1\], got 1\.5\."):
        FederatedTrainer(clients_per_round=1.5, **QUIET)


def test_more_clients_per_round_than_clients_fails_before_training() -> None:
    trainer = FederatedTrainer(clients_per_round=NUM_CLIENTS + 1, **QUIET)
    _fit_fails_before_training(
        trainer, ValueError, rf"`clients_per_round={NUM_CLIENTS + 1}` is not allowed with num_clients={NUM_CLIENTS}"
    )


@pytest.mark.parametrize(("value", "expected"), [(NUM_CLIENTS, NUM_CLIENTS), (1.0, NUM_CLIENTS), (0.5, 2), (0.01, 1)])
def test_valid_clients_per_round_resolves_to_a_count(value: int | float, expected: int) -> None:
    trainer = FederatedTrainer(clients_per_round=value, **{**QUIET, "max_epochs": 1})
    trainer.fit(_CountingModel(), datamodule=_data())
    assert trainer.algorithm.federation.clients_per_round == expected
    assert [len(c) for c in trainer.fit_loop.history] == [expected]


class _PlainDataModule(pl.LightningDataModule):
    def train_dataloader(self) -> DataLoader:
        return DataLoader(TensorDataset(torch.randn(8, 3), torch.randint(0, 2, (8,))), batch_size=4)


def test_federation_options_with_federated_data_are_refused() -> None:
    # num_clients/partitioner federate a plain LightningDataModule; ignoring them silently would surprise.
    _fit_fails_before_training(
        FederatedTrainer(num_clients=3, **QUIET), ValueError,
        r"FederatedTrainer\(num_clients=3\) federates a plain LightningDataModule, but FederatedDataModule already defines",
    )


@pytest.mark.parametrize(("kwargs", "exc", "match"), [
    ({"num_clients": 0}, ValueError, r"num_clients must be an int >= 1, got 0\."),
    ({"partitioner": "iid"}, TypeError, r"`partitioner` must be an fl_lightning.data.Partitioner .* got str\."),
])
def test_bad_federation_options_fail_at_construction(kwargs: dict, exc: type[Exception], match: str) -> None:
    with pytest.raises(exc, match=match):
        FederatedTrainer(**kwargs, **QUIET)


@pytest.mark.filterwarnings("ignore:You defined a `validation_step` but have no `val_dataloader`")
def test_plain_dataloaders_are_rejected() -> None:
    loader = DataLoader(TensorDataset(torch.randn(8, 3), torch.randint(0, 2, (8,))), batch_size=4)
    model = _CountingModel()
    with pytest.raises(TypeError, match=r"pass `datamodule=FederatedDataModule\(\.\.\.\)`, or any LightningDataModule.*got DataLoader\."):
        FederatedTrainer(**QUIET).fit(model, train_dataloaders=loader)
    assert model.steps == 0


class _FixedSelection(FedAvg):
    def __init__(self, clients: list[int]) -> None:
        super().__init__()
        self.clients = clients

    def select_clients(self, round_idx: int) -> list[int]:
        return list(self.clients)


@pytest.mark.parametrize("clients", [[0, 0], [1, 3, 1], [0, NUM_CLIENTS], [-1, 2]])
def test_bad_client_selection_is_rejected(clients: list[int]) -> None:
    trainer = FederatedTrainer(algorithm=_FixedSelection(clients), clients_per_round=2, **QUIET)
    model = _CountingModel()
    ids = ", ".join(str(c) for c in clients)
    with pytest.raises(
        ValueError,
        match=rf"_FixedSelection\.select_clients returned \[{ids}\]: client ids must be distinct and in 0\.\.{NUM_CLIENTS - 1}\.",
    ):
        trainer.fit(model, datamodule=_data())
    assert model.steps == 0  # the selection is checked before any client trains


def test_custom_selection_of_valid_ids_runs() -> None:
    trainer = FederatedTrainer(algorithm=_FixedSelection([3, 1]), clients_per_round=2, **QUIET)
    trainer.fit(_CountingModel(), datamodule=_data())
    assert trainer.fit_loop.history == [[3, 1], [3, 1]]
