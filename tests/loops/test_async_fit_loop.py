"""AsyncFitLoop on a virtual clock: the golden event trace, FedBuff = FedAvg, resume, bad input."""

from __future__ import annotations

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from fl_lightning import FedAvg
from fl_lightning.algorithms.fedbuff import FedBuff
from fl_lightning.algorithms.fedstaleweight import FedStaleWeight
from fl_lightning.cli import fit_summary
from fl_lightning.participation.speed import ConstantDelay, UniformDelay

from ..algorithms.quadratic import CENTRES, Quadratic, quadratic_data, quadratic_trainer
from ..algorithms.shared.test_asynchronous import BufferMean

A, B, C = 0, 1, 2


class Recording(FedStaleWeight):
    """FedStaleWeight that keeps every buffer's weights."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.weights: list[list[float]] = []

    def buffer_weights(self, updates):
        weights = super().buffer_weights(updates)
        self.weights.append(weights)
        return weights


def run_trace(policy: str):
    algorithm = Recording(buffer_size=2, delays=ConstantDelay([1.0, 1.5, 4.25]), pull_policy=policy)
    trainer = quadratic_trainer(max_epochs=6, algorithm=algorithm, local_steps=1)
    trainer.fit(Quadratic(), datamodule=quadratic_data(CENTRES[:3]))
    return trainer.fit_loop, algorithm


def test_golden_trace_immediate_pull():
    loop, algorithm = run_trace("immediate")
    assert loop.arrivals == [
        (1.0, A, 0), (1.5, B, 0), (2.0, A, 0), (3.0, B, 1), (3.0, A, 1), (4.0, A, 2),
        (4.25, C, 0), (4.5, B, 2), (5.0, A, 3), (6.0, B, 4), (6.0, A, 4), (7.0, A, 5),
    ]  # fmt: skip
    assert loop.history == [[A, B], [A, B], [A, A], [C, B], [A, B], [A, A]]
    expected = [[0.5, 0.5], [2 / 3, 1 / 3], [0.5, 0.5], [0.8077, 0.1923], [0.5946, 0.4054], [0.5, 0.5]]
    for got, want in zip(algorithm.weights, expected):
        assert got == pytest.approx(want, abs=1e-4)


def test_golden_trace_wait_for_a_new_version():
    loop, algorithm = run_trace("wait_new_version")
    assert loop.arrivals == [
        (1.0, A, 0), (1.5, B, 0), (2.5, A, 1), (3.0, B, 1), (4.0, A, 2), (4.25, C, 0),
        (4.5, B, 2), (5.25, A, 3), (6.0, B, 3), (6.25, A, 4), (7.25, A, 5), (7.5, B, 4),
    ]  # fmt: skip
    assert loop.history == [[A, B], [A, B], [A, C], [B, A], [B, A], [A, B]]
    expected = [[0.5, 0.5], [0.5, 0.5], [0.1667, 0.8333], [0.625, 0.375], [0.6667, 0.3333], [0.3125, 0.6875]]
    for got, want in zip(algorithm.weights, expected):
        assert got == pytest.approx(want, abs=1e-4)


def test_paired_traces_and_virtual_time_metric():
    fedbuff_loop, _ = run_trace("immediate")
    algorithm = FedBuff(buffer_size=2, delays=ConstantDelay([1.0, 1.5, 4.25]))
    trainer = quadratic_trainer(max_epochs=6, algorithm=algorithm, local_steps=1)
    trainer.fit(Quadratic(), datamodule=quadratic_data(CENTRES[:3]))
    assert trainer.fit_loop.arrivals == fedbuff_loop.arrivals  # the trace depends on the seed only
    assert trainer.callback_metrics["round/virtual_time"] == 7.0
    assert trainer.callback_metrics["round/version"] == 6.0


@pytest.mark.parametrize("algorithm_class", [FedBuff, BufferMean])  # BufferMean: the AsyncAlgorithm contract alone
def test_fedbuff_with_everyone_in_the_buffer_is_synchronous_fedavg(algorithm_class):
    sync, buffered = Quadratic(lr=0.1), Quadratic(lr=0.1)
    quadratic_trainer(max_epochs=3, algorithm=FedAvg(weighting="uniform"), local_steps=2).fit(sync, datamodule=quadratic_data())
    algorithm = algorithm_class(buffer_size=4, delays=ConstantDelay(1.0), pull_policy="wait_new_version")
    trainer = quadratic_trainer(max_epochs=3, algorithm=algorithm, local_steps=2)
    trainer.fit(buffered, datamodule=quadratic_data())
    assert trainer.fit_loop.history == [[0, 1, 2, 3]] * 3
    assert torch.allclose(sync.w, buffered.w, atol=1e-12, rtol=0)
    assert not torch.equal(buffered.w, torch.zeros(2, dtype=torch.float64))


def test_resume_with_events_in_flight(tmp_path):
    def make():
        return FedStaleWeight(buffer_size=2, delays=UniformDelay(1.0, 3.0))

    straight = Quadratic(lr=0.2)
    checkpoint = ModelCheckpoint(dirpath=tmp_path, every_n_epochs=1, save_top_k=-1, filename="{epoch}")
    trainer = quadratic_trainer(max_epochs=6, algorithm=make(), local_steps=2, callbacks=[checkpoint], enable_checkpointing=True)
    trainer.fit(straight, datamodule=quadratic_data())
    arrivals, influence = trainer.fit_loop.arrivals, trainer.algorithm.influence.copy()

    resumed = Quadratic(lr=0.2)
    trainer = quadratic_trainer(max_epochs=6, algorithm=make(), local_steps=2)
    trainer.fit(resumed, datamodule=quadratic_data(), ckpt_path=tmp_path / "epoch=2.ckpt")
    assert trainer.fit_loop.arrivals == arrivals
    assert trainer.algorithm.influence.tolist() == influence.tolist()
    assert torch.equal(straight.w, resumed.w)


def test_resume_from_a_checkpoint_inside_an_aggregation(tmp_path):
    def make():
        return FedBuff(buffer_size=2, delays=UniformDelay(1.0, 3.0))

    straight = Quadratic(lr=0.2)
    quadratic_trainer(max_epochs=5, algorithm=make(), local_steps=2).fit(straight, datamodule=quadratic_data())
    mid = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=9, save_top_k=-1, filename="{step}")
    quadratic_trainer(max_epochs=3, algorithm=make(), local_steps=2, callbacks=[mid], enable_checkpointing=True).fit(
        Quadratic(lr=0.2), datamodule=quadratic_data()
    )
    last = max(tmp_path.glob("step=*.ckpt"), key=lambda p: int(p.stem.split("=")[1]))
    resumed = Quadratic(lr=0.2)
    quadratic_trainer(max_epochs=5, algorithm=make(), local_steps=2).fit(resumed, datamodule=quadratic_data(), ckpt_path=last)
    assert torch.equal(straight.w, resumed.w)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"buffer_size": 0}, r"`buffer_size` must be an integer >= 1, got 0"),
        ({"concurrency": 0}, r"`concurrency` must be an integer >= 1, got 0"),
        ({"server_lr": 0.0}, r"`server_lr` must be a finite number > 0"),
        ({"staleness_discount": "linear"}, r"`staleness_discount` must be one of"),
        ({"pull_policy": "never"}, r"`pull_policy` must be 'immediate' or 'wait_new_version'"),
        ({"max_staleness": -1}, r"`max_staleness` must be an integer >= 0"),
    ],
)
def test_bad_constructor_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        FedBuff(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"buffer_size": 3, "concurrency": 2}, r"^FedBuff: `buffer_size=3` exceeds `concurrency=2` \(a buffer fills"),
        ({"buffer_size": 5}, r"^FedBuff: `buffer_size=5` exceeds `concurrency=4`, its default: every client"),
        ({"concurrency": 9}, r"^FedBuff: `concurrency=9` exceeds the 4 clients"),
    ],
)
def test_bad_federation_input_fails_before_training(kwargs, match):
    model = Quadratic()
    with pytest.raises(ValueError, match=match):
        quadratic_trainer(max_epochs=1, algorithm=FedBuff(**kwargs)).fit(model, datamodule=quadratic_data())
    assert model.optimizer_steps == 0


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: ConstantDelay(0.0), r"`duration` must be > 0 and finite, got 0.0"),
        (lambda: ConstantDelay([1.0, -2.0]), r"`duration` must be > 0 and finite, got -2.0"),
        (lambda: UniformDelay(low=0.0, high=1.0), r"`low` must be > 0"),
    ],
)
def test_non_positive_durations_are_rejected(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_per_client_delay_lists_are_checked_before_training():
    model = Quadratic()
    with pytest.raises(ValueError, match="ConstantDelay: got 2 per-client values of `value` for num_clients=4"):
        quadratic_trainer(max_epochs=1, algorithm=FedBuff(buffer_size=2, delays=ConstantDelay([1.0, 2.0]))).fit(
            model, datamodule=quadratic_data()
        )
    assert model.optimizer_steps == 0


@pytest.mark.parametrize(("algorithm", "label"), [(FedBuff(buffer_size=2, concurrency=2), "aggregations run"), (FedAvg(), "rounds run")])
def test_the_fit_summary_counts_aggregations_of_an_asynchronous_algorithm(algorithm, label):
    trainer = quadratic_trainer(max_epochs=3, algorithm=algorithm)
    trainer.fit(Quadratic(), datamodule=quadratic_data())
    table = fit_summary(trainer, wall_time_s=1.0)
    assert dict(zip(table.columns[0].cells, table.columns[1].cells))[label] == "3"
