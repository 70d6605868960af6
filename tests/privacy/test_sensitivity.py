"""Compositions that would break DP's sensitivity bound are refused, naming both parts; DPFedBuff's zero-out
adjacency holds; a round in which no update survives still releases noise and spends budget (issue 24 item 5)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fl_lightning import DPFedAvg, FedBuff, MedianNormFilter, NormClip
from fl_lightning.privacy import DPFedBuff, LocalDP
from fl_lightning.privacy.dp_fedavg import clipped_sum
from fl_lightning.robust import Bulyan, CoordinateMedian, Krum, TrimmedMean
from fl_lightning.participation.speed import ConstantDelay
from tests.algorithms.quadratic import CENTRES, Quadratic, quadratic_data, quadratic_trainer
from tests.privacy import reference
from tests.privacy.conftest import global_state, make_federation, updates_with_norms
from tests.recording_logger import RecordingLogger


def test_median_norm_filter_moves_the_sum_by_more_than_the_clip_norm():
    """Why it is refused: norms [1 x 5, 4 x 4] -> [1 x 4, 4 x 5] (one client changed) moves what the filter
    keeps by 19 units of norm, against a sensitivity of 2C = 8 for clip norm 4."""
    before, after = [1.0] * 5 + [4.0] * 4, [1.0] * 4 + [4.0] * 5
    bound = MedianNormFilter(factor=3.0)
    kept = [sum(n for n, s in zip(norms, bound.scales(norms)) if s is not None) for norms in (before, after)]
    assert kept == [5.0, 24.0]


@pytest.mark.parametrize(
    "build",
    [
        lambda: DPFedAvg(noise_multiplier=1.0, clip_norm=1.0),
        lambda: DPFedBuff(noise_multiplier=1.0, clip_norm=1.0, algorithm=FedBuff(buffer_size=2)),
    ],
    ids=["dp-fedavg", "dp-fedbuff"],
)
def test_a_bound_that_compares_clients_is_refused_under_dp_naming_both(build):
    trainer = quadratic_trainer(max_epochs=1, algorithm=build(), update_bound=MedianNormFilter(factor=3.0))
    name = type(trainer.fit_loop.algorithm).__name__
    with pytest.raises(ValueError, match=rf"{name} .*update_bound=MedianNormFilter\(\.\.\.\) decides each update from the other"):
        trainer.fit(Quadratic(), datamodule=quadratic_data(CENTRES))


def test_norm_clip_still_composes_with_dp():
    algorithm = DPFedAvg(noise_multiplier=1.0, clip_norm=1.0)
    trainer = quadratic_trainer(max_epochs=1, algorithm=algorithm, update_bound=NormClip(max_norm=2.0))
    trainer.fit(Quadratic(), datamodule=quadratic_data(CENTRES))
    assert float(trainer.callback_metrics["round/dp_epsilon"]) > 0


@pytest.mark.parametrize("rule", [CoordinateMedian, TrimmedMean, Krum, Bulyan])
def test_a_robust_rule_over_central_dp_is_refused_naming_both(rule):
    kwargs = {"num_byzantine": 0} if rule in (Krum, Bulyan) else {}
    with pytest.raises(ValueError, match=rf"{rule.__name__} and DPFedAvg cannot be combined"):
        rule(algorithm=DPFedAvg(noise_multiplier=1.0), **kwargs)


def test_dp_fedbuff_moves_by_at_most_c_under_zero_out_and_its_epsilon_is_not_below_pld():
    """Zero-out adjacency: one user's update replaced by a zero update moves the clipped sum by at most C."""
    state = global_state(make_federation())
    updates = updates_with_norms(state, [0.5, 3.0, 10.0, 1.0])
    base, _ = clipped_sum([u.payload for u in updates], 2.0)
    for k in range(len(updates)):
        zeroed = [u.payload if i != k else {n: torch.zeros_like(t) for n, t in u.payload.items()} for i, u in enumerate(updates)]
        moved, _ = clipped_sum(zeroed, 2.0)
        shift = math.sqrt(sum(float((moved[n] - base[n]).double().square().sum()) for n in base if base[n].is_floating_point()))
        assert shift <= 2.0 * (1 + 1e-6)
    for z, aggregations, delta in [(0.8, 1, 1e-5), (1.5, 20, 1e-5), (3.0, 100, 1e-3)]:
        algorithm = DPFedBuff(noise_multiplier=z, clip_norm=1.0, delta=delta, algorithm=FedBuff(buffer_size=2))
        assert algorithm.epsilon(aggregations) >= reference.gaussian_pld(z, aggregations, delta, reference.ADD_OR_REMOVE)


def test_local_dp_epsilon_is_not_below_pld_under_replace_one():
    """LocalDP's neighbours are two datasets of one client: replace-one, a shift of up to 2C (PLD's convention)."""
    federation = make_federation()
    state = global_state(federation)
    for z, rounds, delta in [(1.0, 3, 1e-5), (4.0, 10, 1e-3)]:
        algorithm = LocalDP(noise_multiplier=z, clip_norm=1.0, delta=delta)
        algorithm.setup(federation)
        for round_idx in range(rounds):
            epsilon = algorithm.aggregate(round_idx, state, updates_with_norms(state, [1.0]))["local_dp_epsilon"]
        assert epsilon >= reference.gaussian_pld(z, rounds, delta, reference.REPLACE)


def test_a_round_with_no_usable_update_still_releases_noise_and_spends_budget():
    """Every client's update is NaN (lr = NaN) and dropped: the model still moves by the noise and ε grows, so a
    round's emptiness, which depends on the clients' data, is not released in the clear."""
    algorithm = DPFedAvg(noise_multiplier=1.0, clip_norm=1.0, log_client_statistics=True)  # to read the count
    trainer = quadratic_trainer(max_epochs=2, algorithm=algorithm, clients_per_round=2)
    model = Quadratic(lr=math.nan)
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.warns(UserWarning, match="no client update to aggregate; DPFedAvg aggregates the empty round"):
        trainer.fit(model, datamodule=quadratic_data(CENTRES))
    assert float(trainer.callback_metrics["round/aggregated_clients"]) == 0.0
    assert algorithm.rounds_spent == 2
    logged = float(trainer.callback_metrics["round/dp_epsilon"])
    assert logged == pytest.approx(algorithm.epsilon(), rel=1e-6)  # logged as float32
    step = np.concatenate([(p.detach() - b).reshape(-1).numpy() for p, b in zip(model.parameters(), before)])
    assert np.isfinite(step).all() and (step != 0).all()  # the noise, divided by m = 2


def test_dp_fedbuff_aggregates_a_non_finite_update_as_a_zero_update():
    """Zero-out adjacency: a NaN update becomes its neighbour, a zero update with its weight, so every buffer
    releases noise and no buffer's step depends on whether an update was finite."""
    algorithm = DPFedBuff(
        noise_multiplier=1.0, clip_norm=1.0, log_client_statistics=True, algorithm=FedBuff(buffer_size=2, delays=ConstantDelay(1.0))
    )
    logger = RecordingLogger()
    trainer = quadratic_trainer(max_epochs=3, algorithm=algorithm, local_steps=1, logger=logger)
    model = Quadratic(lr=math.nan)
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.warns(UserWarning, match="DPFedBuff aggregates a stand-in in its place"):
        trainer.fit(model, datamodule=quadratic_data(CENTRES))
    assert [m["round/dropped_clients"] for _, m in logger.records if "round/dropped_clients" in m] == [0.0] * 3
    assert algorithm.aggregations == 3
    step = np.concatenate([(p.detach() - b).reshape(-1).numpy() for p, b in zip(model.parameters(), before)])
    assert np.isfinite(step).all() and (step != 0).all()  # the noise alone
