"""DPFedBuff's zero-out adjacency holds whatever a client sends: a NaN or Inf update, or a NaN/Inf training loss
with a finite update, is aggregated as a zero update, so each buffer's count, step weights and noise scale are
those of a run in which the client behaved (issue 38, item 4)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from fl_lightning import FedAvg, FedBuff
from fl_lightning.loops.guards import decode_and_screen
from fl_lightning.participation.speed import ConstantDelay
from fl_lightning.privacy import DPFedBuff
from tests.algorithms.quadratic import CENTRES, Quadratic, quadratic_data, quadratic_trainer
from tests.privacy.conftest import global_state, make_federation, updates_with_norms
from tests.recording_logger import RecordingLogger

ROUNDS = 4
KEYS = ("round/aggregated_clients", "round/dropped_clients", "round/dp_noise_std", "round/dp_epsilon")


def _fit(bad: float | None) -> tuple[dict[str, list[float]], DPFedBuff, list[list[int]]]:
    """A DPFedBuff fit (buffer 3 of 4 clients in flight, unequal speeds); client 1's data is ``bad`` (NaN/Inf)."""
    centres = CENTRES.clone()
    if bad is not None:
        centres[1] = bad
    fedbuff = FedBuff(buffer_size=3, delays=ConstantDelay([1.0, 1.5, 2.0, 3.0]))
    algorithm = DPFedBuff(noise_multiplier=1.0, clip_norm=1.0, log_client_statistics=True, algorithm=fedbuff)
    logger = RecordingLogger()
    trainer = quadratic_trainer(max_epochs=ROUNDS, algorithm=algorithm, local_steps=2, logger=logger)
    trainer.fit(Quadratic(), datamodule=quadratic_data(centres))
    series = {key: [m[key] for _, m in logger.records if key in m] for key in KEYS}
    return series, algorithm, trainer.fit_loop.history


@pytest.fixture(scope="module")
def clean():
    return _fit(None)


@pytest.mark.parametrize("bad", [math.nan, math.inf], ids=["nan_loss", "inf"])
def test_a_client_with_non_finite_loss_and_update_counts_as_a_zero_update(clean, bad):
    with pytest.warns(UserWarning, match="DPFedBuff aggregates a stand-in in its place"):
        series, algorithm, history = _fit(bad)
    expected, clean_algorithm, clean_history = clean
    assert history == clean_history and any(1 in buffer for buffer in history)  # client 1 is in the buffers
    assert series["round/dropped_clients"] == [0.0] * ROUNDS
    assert series["round/aggregated_clients"] == expected["round/aggregated_clients"] == [3.0] * ROUNDS
    assert series["round/dp_noise_std"] == expected["round/dp_noise_std"] == [1.0] * ROUNDS
    assert series["round/dp_epsilon"] == expected["round/dp_epsilon"]
    assert algorithm.aggregations == clean_algorithm.aggregations == ROUNDS


def _one(payload_value: float, loss: float):
    state = global_state(make_federation())
    (update,) = updates_with_norms(state, [1.0])
    payload = {k: (torch.full_like(v, payload_value) if v.is_floating_point() else v) for k, v in update.payload.items()}
    return replace(update, payload=payload, metrics={**update.metrics, "train_loss": loss})


@pytest.mark.parametrize(
    ("payload_value", "loss"),
    [(math.nan, 1.0), (math.inf, 1.0), (-math.inf, 1.0), (0.5, math.nan), (0.5, math.inf)],
    ids=["nan_update", "inf_update", "minus_inf_update", "nan_loss_finite_update", "inf_loss_finite_update"],
)
def test_the_guard_substitutes_a_zero_update_for_dp_fedbuff_and_drops_it_for_fedavg(payload_value, loss):
    update = _one(payload_value, loss)
    dp = DPFedBuff(noise_multiplier=1.0, clip_norm=1.0, algorithm=FedBuff(buffer_size=2))
    with pytest.warns(UserWarning, match="aggregates a stand-in"):
        screened = decode_and_screen(dp, 0, [update])
    assert screened.dropped == [] and screened.replaced == [update.client_id]
    (stand_in,) = screened.finite
    assert all((t == 0).all() for t in stand_in.payload.values()) and "train_loss" not in stand_in.metrics
    with pytest.warns(UserWarning, match="it is dropped"):
        plain = decode_and_screen(FedAvg(), 0, [update])
    assert plain.dropped == [update.client_id] and plain.finite == [] and plain.replaced == []
