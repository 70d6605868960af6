"""Checkpoints keep the newest records (client history, async arrivals): their size stays flat, resume stays exact."""

from __future__ import annotations

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from fl_lightning import FedAvg
from fl_lightning.algorithms.fedbuff import FedBuff
from fl_lightning.loops import records
from fl_lightning.participation.speed import UniformDelay

from ..algorithms.quadratic import Quadratic, quadratic_data, quadratic_trainer

KEPT = 4


@pytest.fixture(autouse=True)
def few_records(monkeypatch):
    monkeypatch.setattr(records, "RECORDS_KEPT", KEPT)


def fedbuff() -> FedBuff:
    return FedBuff(buffer_size=2, delays=UniformDelay(1.0, 3.0))


def federated(path) -> dict:
    return torch.load(path, weights_only=False)["loops"]["fit_loop"]["state_dict"]["federated"]


def test_async_checkpoint_size_does_not_grow_with_aggregations(tmp_path):
    sizes = {}
    for aggregations in (10, 60):
        trainer = quadratic_trainer(max_epochs=aggregations, algorithm=fedbuff(), local_steps=1)
        trainer.fit(Quadratic(), datamodule=quadratic_data())
        path = tmp_path / f"{aggregations}.ckpt"
        trainer.save_checkpoint(path)
        sizes[aggregations] = path.stat().st_size
        state = federated(path)
        assert len(state["history"]) == len(state["async"]["arrivals"]) == KEPT
        assert state["history_start"] == aggregations - KEPT
        assert state["history"] == trainer.fit_loop.history[-KEPT:]
        assert state["async"]["arrivals"] == trainer.fit_loop.arrivals[-KEPT:]
    # Unbounded, 50 aggregations more would add about 2.5 kB; what remains is counters growing a digit.
    assert abs(sizes[60] - sizes[10]) < 100


def test_async_resume_from_a_trimmed_checkpoint_is_exact(tmp_path):
    straight = Quadratic(lr=0.2)
    every = ModelCheckpoint(dirpath=tmp_path, every_n_epochs=1, save_top_k=-1, filename="{epoch}")
    trainer = quadratic_trainer(max_epochs=12, algorithm=fedbuff(), local_steps=2, callbacks=[every], enable_checkpointing=True)
    trainer.fit(straight, datamodule=quadratic_data())
    history, arrivals = trainer.fit_loop.history, trainer.fit_loop.arrivals

    resumed = Quadratic(lr=0.2)
    trainer = quadratic_trainer(max_epochs=12, algorithm=fedbuff(), local_steps=2)
    trainer.fit(resumed, datamodule=quadratic_data(), ckpt_path=tmp_path / "epoch=7.ckpt")  # 8 aggregations done
    loop = trainer.fit_loop
    assert loop.history_start == 8 - KEPT and loop.history == history[loop.history_start :]
    assert loop.arrivals_start > 0 and loop.arrivals == arrivals[loop.arrivals_start :]
    assert torch.equal(straight.w, resumed.w)


def test_async_resume_inside_an_aggregation_from_a_trimmed_checkpoint_is_exact(tmp_path):
    straight = Quadratic(lr=0.2)
    trainer = quadratic_trainer(max_epochs=9, algorithm=fedbuff(), local_steps=2)
    trainer.fit(straight, datamodule=quadratic_data())
    history = trainer.fit_loop.history
    mid = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=9, save_top_k=-1, filename="{step}")
    quadratic_trainer(max_epochs=7, algorithm=fedbuff(), local_steps=2, callbacks=[mid], enable_checkpointing=True).fit(
        Quadratic(lr=0.2), datamodule=quadratic_data()
    )
    last = max(tmp_path.glob("step=*.ckpt"), key=lambda p: int(p.stem.split("=")[1]))
    state = federated(last)
    assert len(state["history"]) == KEPT and state["history_start"] + KEPT == state["rounds_done"]
    resumed = Quadratic(lr=0.2)
    trainer = quadratic_trainer(max_epochs=9, algorithm=fedbuff(), local_steps=2)
    trainer.fit(resumed, datamodule=quadratic_data(), ckpt_path=last)
    assert trainer.fit_loop.history == history[state["history_start"] :]
    assert torch.equal(straight.w, resumed.w)


def test_synchronous_resume_from_a_trimmed_history_is_exact(tmp_path):
    def fit(model, **kwargs):
        trainer = quadratic_trainer(max_epochs=8, algorithm=FedAvg(), clients_per_round=2, seed=3, local_steps=2, **kwargs)
        trainer.fit(model, datamodule=quadratic_data(), ckpt_path=kwargs.pop("ckpt_path", None))
        return trainer.fit_loop

    straight = Quadratic(lr=0.2)
    every = ModelCheckpoint(dirpath=tmp_path, every_n_epochs=1, save_top_k=-1, filename="{epoch}")
    history = fit(straight, callbacks=[every], enable_checkpointing=True).history
    assert len(federated(tmp_path / "epoch=6.ckpt")["history"]) == KEPT

    resumed = Quadratic(lr=0.2)
    trainer = quadratic_trainer(max_epochs=8, algorithm=FedAvg(), clients_per_round=2, seed=3, local_steps=2)
    trainer.fit(resumed, datamodule=quadratic_data(), ckpt_path=tmp_path / "epoch=5.ckpt")  # 6 rounds done
    assert trainer.fit_loop.history_start == 6 - KEPT
    assert trainer.fit_loop.history == history[6 - KEPT :]
    assert torch.equal(straight.w, resumed.w)
