"""FedBuff(train_at=...): the pulled model (default) or the model current at arrival (FedStaleWeight's Fig. 2 runtime).

Quadratic devices with one full-batch GD step have the closed form
:math:`\\Delta_k = \\eta (c_k - w)` with :math:`w` the model the client trained on, so each update
shows which model version it was computed from.
"""

from __future__ import annotations

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from fl_lightning.algorithms.fedstaleweight import FedStaleWeight
from fl_lightning.participation.speed import ConstantDelay

from ..algorithms.quadratic import CENTRES, Quadratic, quadratic_data, quadratic_trainer

LR = 0.05


class Recording(FedStaleWeight):
    """Keeps, per aggregated update: its staleness, its delta, the current global model, and the buffer weights."""

    def __init__(self, **kwargs):
        super().__init__(buffer_size=2, delays=ConstantDelay([1.0, 1.5, 4.25]), **kwargs)
        self.seen: list[tuple[int, int, torch.Tensor, torch.Tensor]] = []
        self.weights: list[list[float]] = []
        self.versions: list[torch.Tensor] = [torch.zeros(2, dtype=torch.float64)]

    def buffer_weights(self, updates):
        weights = super().buffer_weights(updates)
        self.weights.append(weights)
        return weights

    def aggregate(self, round_idx, global_state, updates):
        for u in updates:
            self.seen.append((u.client_id, u.staleness, u.payload["w"].clone(), global_state["w"].clone()))
        metrics = super().aggregate(round_idx, global_state, updates)
        self.versions.append(global_state["w"].clone())
        return metrics


def run(**kwargs):
    algorithm = Recording(**kwargs)
    model = Quadratic(lr=LR)
    trainer = quadratic_trainer(max_epochs=6, algorithm=algorithm, local_steps=1)
    trainer.fit(model, datamodule=quadratic_data(CENTRES[:3]))
    return trainer.fit_loop, algorithm, model


def test_arrival_mode_trains_on_the_model_current_at_arrival_and_keeps_the_delay_staleness():
    dispatch_loop, dispatch, _ = run()
    loop, arrival, _ = run(train_at="arrival")
    # Same events, same delay-based staleness, so FedStaleWeight's re-weighting is unchanged (§3.1, eq. 8).
    assert loop.arrivals == dispatch_loop.arrivals and loop.history == dispatch_loop.history
    assert [s[:2] for s in arrival.seen] == [s[:2] for s in dispatch.seen]
    assert arrival.weights == dispatch.weights
    assert max(staleness for _, staleness, _, _ in arrival.seen) >= 2
    for cid, _, delta, current in arrival.seen:  # parameter staleness 0: Delta = lr (c - w_current)
        torch.testing.assert_close(delta, LR * (CENTRES[cid] - current), rtol=0, atol=1e-12)
    stale = 0
    for cid, staleness, delta, current in dispatch.seen:  # dispatch: Delta = lr (c - w_pulled)
        if staleness:
            stale += 1
            assert not torch.allclose(delta, LR * (CENTRES[cid] - current))
    assert stale > 0


def test_dispatch_mode_trains_on_the_pulled_version():
    _, algorithm, _ = run(train_at="dispatch")
    for index, (cid, staleness, delta, _) in enumerate(algorithm.seen):
        version = index // 2  # two updates per aggregation
        pulled = algorithm.versions[version - staleness]
        torch.testing.assert_close(delta, LR * (CENTRES[cid] - pulled), rtol=0, atol=1e-12)


def test_dispatch_is_the_default_bit_for_bit():
    _, default, default_model = run()
    _, explicit, explicit_model = run(train_at="dispatch")
    assert torch.equal(default_model.w, explicit_model.w)
    assert default.weights == explicit.weights


def test_arrival_mode_resumes_identically(tmp_path):
    _, _, straight = run(train_at="arrival")
    checkpoint = ModelCheckpoint(dirpath=tmp_path, save_last=True)
    quadratic_trainer(max_epochs=3, algorithm=Recording(train_at="arrival"), local_steps=1, callbacks=[checkpoint], enable_checkpointing=True).fit(
        Quadratic(lr=LR), datamodule=quadratic_data(CENTRES[:3])
    )
    resumed = Quadratic(lr=LR)
    quadratic_trainer(max_epochs=6, algorithm=Recording(train_at="arrival"), local_steps=1).fit(
        resumed, datamodule=quadratic_data(CENTRES[:3]), ckpt_path=checkpoint.last_model_path
    )
    assert checkpoint.last_model_path
    assert torch.equal(resumed.w, straight.w)


def test_bad_train_at_is_rejected():
    with pytest.raises(ValueError, match="train_at"):
        FedStaleWeight(train_at="completion")
