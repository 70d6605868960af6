"""The AsyncAlgorithm contract: the asynchronous loop runs any subclass, not only FedBuff's family."""

from __future__ import annotations

import numpy as np
import pytest

from fl_lightning import AsyncAlgorithm
from fl_lightning.algorithms.shared.aggregation import apply_delta, weighted_sum
from fl_lightning.participation.speed import ConstantDelay

from ..quadratic import Quadratic, quadratic_data, quadratic_trainer


class BufferMean(AsyncAlgorithm):
    """The smallest asynchronous algorithm: the buffer's mean delta (no FedBuff in its ancestry)."""

    def buffer_weights(self, updates):
        return [1.0 / len(updates)] * len(updates)

    def aggregate(self, round_idx, global_state, updates):
        weights = self.buffer_weights(updates)
        self.record_influence(updates, weights)
        apply_delta(global_state, weighted_sum([u.payload for u in updates], weights))
        return {"buffered": float(len(updates))}


def test_the_loop_runs_an_algorithm_written_against_the_contract_alone():
    # (tests/loops/test_async_fit_loop.py: with everyone in one buffer it is synchronous FedAvg.)
    algorithm = BufferMean(buffer_size=2, concurrency=3, delays=ConstantDelay([1.0, 2.0, 3.0, 4.0]))
    trainer = quadratic_trainer(max_epochs=5, algorithm=algorithm, local_steps=1)
    trainer.fit(Quadratic(), datamodule=quadratic_data())
    aggregated = [c for buffer in trainer.fit_loop.history for c in buffer]
    assert len(aggregated) == 10 and len(set(aggregated)) > 1
    assert algorithm.influence.tolist() == [aggregated.count(c) / 2 for c in range(4)]
    assert trainer.callback_metrics["round/buffered"] == 2.0


def test_contract_is_abstract_and_validated():
    with pytest.raises(TypeError, match="buffer_weights"):
        AsyncAlgorithm(buffer_size=1)  # type: ignore[abstract]
    with pytest.raises(ValueError, match="`buffer_size` must be an integer >= 1, got 0"):
        BufferMean(buffer_size=0)
    with pytest.raises(ValueError, match="`pull_policy` must be 'immediate' or 'wait_new_version', got 'never'"):
        BufferMean(buffer_size=1, pull_policy="never")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="`train_at` must be 'dispatch' or 'arrival', got 'later'"):
        BufferMean(buffer_size=1, train_at="later")  # type: ignore[arg-type]


def test_buffer_larger_than_concurrency_fails_at_setup():
    trainer = quadratic_trainer(max_epochs=1, algorithm=BufferMean(buffer_size=3, concurrency=2))
    with pytest.raises(ValueError, match="`buffer_size=3` exceeds `concurrency=2`"):
        trainer.fit(Quadratic(), datamodule=quadratic_data())


def test_influence_survives_a_checkpoint():
    algorithm = BufferMean(buffer_size=1)
    algorithm.influence = np.array([0.5, 0.25])
    restored = BufferMean(buffer_size=1)
    restored.load_state_dict(algorithm.state_dict())
    assert restored.influence.tolist() == [0.5, 0.25]
