"""LR schedulers across clients and rounds (issue 26, item 2): ``trainer.estimated_stepping_batches`` inside
``configure_optimizers`` is one client's schedule over the fit (rounds x the most steps a client takes in a
round); with ``interval="step"`` every client of round ``r`` sees the LR of schedule step ``r * K + k`` at its
local step ``k``; ``interval="epoch"`` steps once per round. Checked against a plain-PyTorch LR sequence, under
every client executor that runs the scheduler."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from fl_lightning import FedAvg, FedBuff, FederatedTrainer
from fl_lightning.algorithms.shared.algorithm import ClientContext
from fl_lightning.callbacks.federated_callback import FederatedCallback
from fl_lightning.data import FederatedDataModule, InMemoryDataset, Natural
from fl_lightning.models import LogisticRegression
from fl_lightning.participation import UniformDelay

from ..quiet import QUIET

LR, ROUNDS, NUM_CLIENTS, CLIENTS_PER_ROUND = 0.5, 3, 4, 3


def _data(sizes: list[int] | None = None) -> FederatedDataModule:
    """4 clients; with ``sizes``, clients of those sample counts (batches of 4)."""
    g = torch.Generator().manual_seed(0)
    n = sum(sizes) if sizes else 48
    train = InMemoryDataset(inputs=torch.randn(n, 3, generator=g), labels=torch.randint(0, 2, (n,), generator=g), num_classes=2)
    if not sizes:
        return FederatedDataModule(train, num_clients=NUM_CLIENTS, batch_size=4)
    train.client_ids = np.repeat(np.arange(NUM_CLIENTS), sizes)  # type: ignore[attr-defined]
    return FederatedDataModule(train, partitioner=Natural(), num_clients=NUM_CLIENTS, batch_size=4)


class _Scheduled(LogisticRegression):
    """The standard recipe: a cosine over ``estimated_stepping_batches`` (``interval="step"``), or a
    ``StepLR`` halving per round (``interval="epoch"``); records the LR of every step per (round, client)."""

    def __init__(self, interval: str) -> None:
        super().__init__(in_features=3, num_classes=2, lr=LR)
        self.interval = interval
        self.estimated: int | float | None = None
        self.client: tuple[int, int] | None = None
        self.lrs: dict[tuple[int, int], list[float]] = {}

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.SGD(self.parameters(), lr=LR)
        self.estimated = self.trainer.estimated_stepping_batches
        if self.interval == "step":
            scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=self.estimated)
        else:
            scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": self.interval}}

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        assert self.client is not None
        self.lrs.setdefault(self.client, []).append(self.trainer.optimizers[0].param_groups[0]["lr"])
        return super().training_step(batch, batch_idx)


class _ClientTracker(FederatedCallback):
    def on_client_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, client: ClientContext) -> None:
        pl_module.client = (client.round_idx, client.client_id)  # type: ignore[assignment]


def _fit(interval: str, data: FederatedDataModule, **kwargs: Any) -> tuple[_Scheduled, FederatedTrainer]:
    torch.manual_seed(0)
    model = _Scheduled(interval)
    trainer = FederatedTrainer(
        **{**QUIET, "max_epochs": ROUNDS, "clients_per_round": CLIENTS_PER_ROUND, "callbacks": [_ClientTracker()], **kwargs}
    )
    trainer.fit(model, datamodule=data)
    return model, trainer


def _plain_lrs(make: Any, steps: int) -> list[float]:
    """The LR before each of ``steps`` scheduler steps, from plain torch."""
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=LR)
    scheduler = make(optimizer)
    lrs = []
    for _ in range(steps):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return lrs


@pytest.mark.parametrize("executor", ["lightning", "lean"])
@pytest.mark.parametrize(
    ("work", "sizes", "steps_per_round"),
    [({"local_steps": 3}, None, 3), ({"local_epochs": 2}, [4, 8, 12, 24], 12)],  # the biggest client: 6 batches x 2
    ids=["local_steps", "local_epochs-unequal-clients"],
)
def test_a_step_schedule_gives_every_client_of_a_round_the_same_lrs(
    executor: str, work: dict[str, int], sizes: list[int] | None, steps_per_round: int
) -> None:
    model, trainer = _fit("step", _data(sizes), client_executor=executor, **work)
    assert model.estimated == ROUNDS * steps_per_round
    total = ROUNDS * steps_per_round
    reference = _plain_lrs(lambda opt: torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=total), total)
    assert len(model.lrs) == ROUNDS * CLIENTS_PER_ROUND
    for (round_idx, _), lrs in model.lrs.items():
        start = round_idx * steps_per_round
        assert lrs == pytest.approx(reference[start : start + len(lrs)], rel=1e-12, abs=0)
        assert min(lrs) > 0  # never a step at LR 0
    assert trainer.global_step == sum(len(lrs) for lrs in model.lrs.values())


def test_lean_and_lightning_executors_train_the_same_weights_under_a_step_schedule() -> None:
    lightning, _ = _fit("step", _data([4, 8, 12, 24]), client_executor="lightning", local_epochs=2)
    lean, _ = _fit("step", _data([4, 8, 12, 24]), client_executor="lean", local_epochs=2)
    assert all(torch.equal(a, b) for a, b in zip(lightning.state_dict().values(), lean.state_dict().values()))


@pytest.mark.parametrize("executor", ["lightning", "lean", "batched"])
def test_an_epoch_schedule_steps_once_per_round(executor: str) -> None:
    model, _ = _fit("epoch", _data(), client_executor=executor, local_steps=2)
    for (round_idx, _), lrs in model.lrs.items():
        assert lrs == [LR * 0.5**round_idx] * 2


def test_an_asynchronous_client_follows_the_schedule_of_the_version_it_trains_on() -> None:
    buffered = FedBuff(buffer_size=2, concurrency=3, delays=UniformDelay(1.0, 3.0))
    model, _ = _fit("step", _data(), local_steps=3, algorithm=buffered, client_executor="lean")
    reference = _plain_lrs(lambda opt: torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=ROUNDS * 3), (ROUNDS + 1) * 3)
    assert model.estimated == ROUNDS * 3 and len({version for version, _ in model.lrs}) > 1
    for (version, _), lrs in model.lrs.items():  # a client dispatched twice at one version: twice the 3 steps
        assert lrs == pytest.approx(reference[version * 3 : version * 3 + 3] * (len(lrs) // 3), rel=1e-12, abs=0)


def test_the_batched_executor_trains_the_lightning_executors_weights_under_a_step_schedule() -> None:
    """Unequal clients in one group: each member's LR follows the round's schedule from its start, as sequentially."""
    lightning, _ = _fit("step", _data([4, 8, 12, 24]), client_executor="lightning", local_epochs=2)
    batched, _ = _fit("step", _data([4, 8, 12, 24]), client_executor="batched", local_epochs=2)
    for a, b in zip(lightning.state_dict().values(), batched.state_dict().values()):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-6)
    untouched, _ = _fit("epoch", _data([4, 8, 12, 24]), client_executor="batched", local_epochs=2)
    assert not torch.allclose(untouched.net[1].weight, batched.net[1].weight, atol=1e-4)


def test_the_schedule_does_not_depend_on_the_order_clients_train_in() -> None:
    """Two runs whose rounds select the same clients in another order see the same LRs per client."""
    first, _ = _fit("step", _data(), local_steps=3, clients_per_round=NUM_CLIENTS)
    reverse = _ReversedSelection()
    second, _ = _fit("step", _data(), local_steps=3, clients_per_round=NUM_CLIENTS, algorithm=reverse)
    assert list(first.lrs) != list(second.lrs) and first.lrs == second.lrs


def test_a_resumed_fit_continues_the_schedule_where_the_round_ended(tmp_path: Path) -> None:
    every_round = ModelCheckpoint(dirpath=tmp_path, filename="round_{epoch}", save_top_k=-1, every_n_epochs=1)
    whole, _ = _fit("step", _data(), local_steps=3, enable_checkpointing=True, callbacks=[_ClientTracker(), every_round])
    torch.manual_seed(0)
    resumed = _Scheduled("step")
    trainer = FederatedTrainer(**{**QUIET, "max_epochs": ROUNDS, "clients_per_round": CLIENTS_PER_ROUND, "local_steps": 3})
    trainer.callbacks.append(_ClientTracker())  # type: ignore[attr-defined]
    trainer.fit(resumed, datamodule=_data(), ckpt_path=tmp_path / "round_epoch=1.ckpt")
    assert {key: lrs for key, lrs in whole.lrs.items() if key[0] == 2} == resumed.lrs
    assert all(torch.equal(a, b) for a, b in zip(whole.state_dict().values(), resumed.state_dict().values()))


def test_estimated_stepping_batches_is_infinite_without_a_round_limit() -> None:
    trainer = FederatedTrainer(**{**QUIET, "max_epochs": -1, "max_steps": 10})
    assert trainer.estimated_stepping_batches == float("inf")


class _ReversedSelection(FedAvg):
    def select_clients(self, round_idx: int) -> list[int]:
        return list(reversed(super().select_clients(round_idx)))
