"""Memory cannot grow with the number of clients: no client's update outlives its round.

A structural check, not a measurement (``benchmarks/memory.py`` measures): weak references to
every update's payload tensors show which updates are still referenced anywhere (loop,
algorithm, callbacks, logger connector) once a round is over. If any were kept, memory would be
O(clients x model) over a run.
"""

from __future__ import annotations

import weakref

import pytest
import torch

import lightning.pytorch as pl
from fl_lightning import FedAvg, FederatedCallback, FedStaleWeight
from fl_lightning.data import FederatedDataModule, InMemoryDataset
from fl_lightning.models import MLP

from ..integration.conftest import quiet_trainer

NUM_CLIENTS = 120
PER_ROUND = 6


class LiveUpdates(FederatedCallback):
    """Weak references to every update's payload; counts those still alive at each round start."""

    def __init__(self) -> None:
        self.updates: list[list[weakref.ref]] = []
        self.alive_at_round_start: list[int] = []

    def alive(self) -> int:
        # Reference counting frees a dropped update at once; a full gc.collect() would cost ~0.3 s here.
        return sum(any(ref() is not None for ref in refs) for refs in self.updates)

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.alive_at_round_start.append(self.alive())

    def on_client_end(self, trainer, pl_module, client, update) -> None:
        self.updates.append([weakref.ref(t) for t in update.payload.values()])


def many_small_clients() -> FederatedDataModule:
    g = torch.Generator().manual_seed(0)
    data = InMemoryDataset(
        inputs=torch.randn(2 * NUM_CLIENTS, 8, generator=g),
        labels=torch.randint(0, 3, (2 * NUM_CLIENTS,), generator=g),
        num_classes=3,
    )
    return FederatedDataModule(data, num_clients=NUM_CLIENTS, batch_size=2)


@pytest.mark.parametrize(
    ("algorithm", "executor", "bound"),
    [
        (FedAvg, "lightning", 0),
        (FedAvg, "lean", 0),
        # Asynchronous: the clients in flight hold their updates until they arrive, and the
        # epoch-start snapshot (for resuming mid-epoch) holds the last epoch's in-flight ones,
        # of which a buffer's worth have since arrived: concurrency + buffer_size, not O(clients).
        (lambda: FedStaleWeight(buffer_size=3, concurrency=PER_ROUND), "lean", PER_ROUND + 3),
    ],
    ids=["fedavg", "fedavg-lean", "fedstaleweight"],
)
def test_no_update_outlives_its_round(algorithm, executor, bound):
    tracker = LiveUpdates()
    trainer = quiet_trainer(
        algorithm=algorithm(),
        clients_per_round=PER_ROUND,
        local_steps=1,
        max_epochs=4,
        client_executor=executor,
        callbacks=[tracker],
    )
    trainer.fit(MLP(in_features=8, hidden=(4,), num_classes=3), datamodule=many_small_clients())

    assert len(tracker.updates) >= 2 * PER_ROUND  # more updates than the bound, so that a leak would show
    assert max(tracker.alive_at_round_start) <= bound, tracker.alive_at_round_start
    assert tracker.alive() <= bound
