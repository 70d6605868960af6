"""The objects alive when the rounds start are frozen for the fit (no full collection walks them), and only then."""

from __future__ import annotations

import gc

import lightning.pytorch as pl

from fl_lightning.loops.frozen_heap import frozen_heap
from fl_lightning.models import MLP

from ..integration.conftest import digits_data
from ..quiet import quiet_trainer


class FreezeCount(pl.Callback):
    def __init__(self) -> None:
        self.counts: list[int] = []

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.counts.append(gc.get_freeze_count())


def test_the_heap_is_frozen_during_the_rounds_and_unfrozen_after() -> None:
    assert gc.get_freeze_count() == 0
    counter = FreezeCount()
    trainer = quiet_trainer(max_epochs=2, clients_per_round=2, local_steps=1, callbacks=[counter], limit_val_batches=0)
    trainer.fit(MLP(in_features=64, hidden=(8,)), datamodule=digits_data(num_clients=4))
    assert len(counter.counts) == 2 and min(counter.counts) > 1000  # the set-up's objects, frozen
    assert gc.get_freeze_count() == 0


def test_a_freeze_made_before_is_kept() -> None:
    gc.freeze()
    try:
        before = gc.get_freeze_count()
        with frozen_heap():
            assert gc.get_freeze_count() >= before
        assert gc.get_freeze_count() >= before > 0
    finally:
        gc.unfreeze()
