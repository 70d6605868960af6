"""Adaptive clipping (Andrew et al. 2021): the geometric update and the split noise multiplier, by hand; the
released count's sensitivity, and ε never below dp-accounting's for the pair of releases it really makes."""

from __future__ import annotations

import math

import pytest
import torch

from fl_lightning import AdaptiveClipping, DPFedAvg
from fl_lightning.privacy.noise import SeededNoise
from tests.privacy import reference
from tests.privacy.conftest import global_state, make_federation, updates_with_norms


def test_geometric_update_from_the_noised_count():
    clipping = AdaptiveClipping(target_quantile=0.6, learning_rate=0.2, count_noise_std=0.5)
    noise = torch.randn((), generator=torch.Generator().manual_seed(7), dtype=torch.float64).item() * 0.5
    clip, fraction = clipping.next_clip_norm(
        2.0, centred_count=3.0 - 10 / 2, expected_clients=10.0, source=SeededNoise(torch.Generator().manual_seed(7))
    )
    assert fraction == pytest.approx((3.0 + noise) / 10.0)  # 3 of 10 fit
    assert clip == pytest.approx(2.0 * math.exp(-0.2 * (fraction - 0.6)))
    assert clip > 2.0  # fewer than 60 % fit: the clip norm grows


def test_update_noise_multiplier_splits_the_budget():
    clipping = AdaptiveClipping(count_noise_std=1.0)
    z_update = clipping.update_noise_multiplier(1.0, expected_clients=100)
    assert z_update == pytest.approx((1.0 - 0.25) ** -0.5)
    assert (z_update**-2 + (2 * 1.0) ** -2) ** -0.5 == pytest.approx(1.0)  # together: one mechanism of z = 1
    assert AdaptiveClipping().noise_std(expected_clients=40) == 2.0  # the paper's m / 20


def test_the_released_count_moves_by_a_half_per_client_added_and_one_per_client_replaced():
    """The count's sensitivities the combined multiplier assumes: 1/2 under add/remove, 1 under replace-one."""
    federation = make_federation()
    algorithm = DPFedAvg(noise_multiplier=1.0, clip_norm=2.0, adaptive_clipping=AdaptiveClipping(count_noise_std=1.0))
    algorithm.setup(federation)
    updates = updates_with_norms(global_state(federation), [1.0, 3.0, 0.5, 9.0])
    count = algorithm.weighted_delta_sum(updates[:3])[1]
    assert abs(algorithm.weighted_delta_sum(updates)[1] - count) == 0.5  # one more client, fitting or not
    assert abs(algorithm.weighted_delta_sum(updates[:2])[1] - count) == 0.5
    assert abs(algorithm.weighted_delta_sum([*updates[:2], updates[3]])[1] - count) == 1.0  # one replaced


@pytest.mark.parametrize("sampling", ["fixed", "poisson"])
def test_epsilon_covers_the_update_and_the_count_release(sampling):
    """ε after 3 rounds (PLD) is at least dp-accounting's lower PLD bound for the pair (clipped sum, centred count) with the stds
    actually drawn: per round one Gaussian mechanism whose std over sensitivity combines both releases."""
    federation = make_federation(clients_per_round=2)
    z, clip_norm, count_std = 1.0, 2.0, 0.8
    algorithm = DPFedAvg(
        noise_multiplier=z, clip_norm=clip_norm, sampling=sampling, adaptive_clipping=AdaptiveClipping(count_noise_std=count_std)
    )
    algorithm.setup(federation)
    state = global_state(federation)
    for round_idx in range(3):
        metrics = algorithm.aggregate(round_idx, state, updates_with_norms(state, [1.0, 5.0], seed=round_idx))
        update_std = metrics["dp_noise_std"] / metrics["dp_clip_norm"]  # z_Delta, relative to this round's C
    if sampling == "poisson":  # add/remove: the sum moves by C, the centred count by 1/2
        combined = (update_std**-2 + (0.5 / count_std) ** 2) ** -0.5
        expected = reference.poisson_pld_lower(2 / 4, combined, 3, 1e-5)
    else:  # replace-one: the sum moves by 2C, the count by 1
        combined = ((2 / update_std) ** 2 + (1 / count_std) ** 2) ** -0.5
        expected = reference.fixed_size_pld(2 / 4, 2 * combined, 3, 1e-5, pessimistic=False)  # std over C: shift 2
    assert metrics["dp_epsilon"] >= expected * (1 - 1e-9)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"target_quantile": 0.0}, "target_quantile"),
        ({"target_quantile": 1.0}, "target_quantile"),
        ({"learning_rate": 0.0}, "learning_rate"),
        ({"count_noise_std": -1.0}, "count_noise_std"),
    ],
)
def test_bad_input_is_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        AdaptiveClipping(**kwargs)
