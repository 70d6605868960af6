"""The AsyncAlgorithm contract: the asynchronous loop runs any subclass, not only FedBuff's family."""

from __future__ import annotations

import pytest
import torch

from fl_lightning import AsyncAlgorithm, FedAvg
from fl_lightning.algorithms.aggregation import apply_delta, weighted_sum
from fl_lightning.participation.speed import ConstantDelay

from .quadratic import Quadratic, quadratic_data, quadratic_trainer


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
    sync, buffered = Quadratic(lr=0.1), Quadratic(lr=0.1)
    quadratic_trainer(max_epochs=3, algorithm=FedAvg(weighting="uniform"), local_steps=2).fit(sync, datamodule=quadratic_data())
    algorithm = BufferMean(buffer_size=4, delays=ConstantDelay(1.0), pull_policy="wait_new_version")
    trainer = quadratic_trainer(max_epochs=3, algorithm=algorithm, local_steps=2)
    trainer.fit(buffered, datamodule=quadratic_data())
    assert trainer.fit_loop.history == [[0, 1, 2, 3]] * 3
    assert torch.allclose(sync.w, buffered.w, atol=1e-12, rtol=0)  # a full synchronous buffer is FedAvg
    assert algorithm.influence.tolist() == [0.75] * 4
    assert trainer.callback_metrics["round/buffered"] == 4.0
    assert trainer.callback_metrics["round/virtual_time"] == 3.0


def test_contract_is_abstract_and_validated():
    with pytest.raises(TypeError, match="buffer_weights"):
        AsyncAlgorithm(buffer_size=1)  # type: ignore[abstract]
    with pytest.raises(ValueError, match="`buffer_size` must be >= 1, got 0"):
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
    algorithm.influence = torch.tensor([0.5, 0.25]).double().numpy()
    restored = BufferMean(buffer_size=1)
    restored.load_state_dict(algorithm.state_dict())
    assert restored.influence.tolist() == [0.5, 0.25]
