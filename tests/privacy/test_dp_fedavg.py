"""DP-FedAvg: exact clipping, the noise's std, FedAvg as its limit, sharded sums, budget, bad input."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch

from fl_lightning import AdaptiveClipping, DPFedAvg, FedAvg, FedBuff, ServerSGD
from fl_lightning.algorithms import FedALIGN
from fl_lightning.privacy import RoundAccountant
from tests.privacy.conftest import global_state, make_federation, updates_with_norms


def _flat(state: dict[str, torch.Tensor]) -> np.ndarray:
    return np.concatenate([t.double().reshape(-1).numpy() for t in state.values() if t.is_floating_point()])


def _step(algorithm, federation, updates, round_idx=0):
    """The global state before and after one aggregation, and the round's metrics."""
    algorithm.setup(federation)
    before = global_state(federation)
    after = {k: v.clone() for k, v in before.items()}
    metrics = algorithm.aggregate(round_idx, after, updates)
    return before, after, metrics


def test_clipping_is_exact_against_numpy(federation):
    norms = [0.5, 1.0, 3.0, 10.0]
    state = global_state(federation)
    updates = updates_with_norms(state, norms)
    before, after, metrics = _step(DPFedAvg(noise_multiplier=0.0, clip_norm=2.0), federation, updates)

    clipped = [_flat(u.payload) * min(1.0, 2.0 / n) for u, n in zip(updates, norms)]
    assert [np.linalg.norm(c) for c in clipped] == pytest.approx([0.5, 1.0, 2.0, 2.0], rel=1e-6)
    np.testing.assert_allclose(_flat(after) - _flat(before), sum(clipped) / 4, rtol=1e-5, atol=1e-7)
    assert after["bn.num_batches_tracked"] == before["bn.num_batches_tracked"]  # counters are not released
    assert metrics["dp_clip_norm"] == 2.0 and metrics["dp_noise_std"] == 0.0 and metrics["dp_epsilon"] == math.inf


def test_noise_std_is_noise_multiplier_times_clip_norm():
    federation = make_federation(clients_per_round=4)
    state = global_state(federation)
    zeros = updates_with_norms(state, [0.0, 0.0, 0.0])  # three clients report, four are expected
    before, after, metrics = _step(DPFedAvg(noise_multiplier=1.5, clip_norm=2.0), federation, zeros)

    noise = (_flat(after) - _flat(before)) * 4  # the server divides the noised sum by m = 4
    # 100 104 draws: the sample std's relative standard error is 1/sqrt(2n) = 0.22 %; 1 % is 4.5 of those.
    assert metrics["dp_noise_std"] == 3.0
    assert noise.std() == pytest.approx(3.0, rel=0.01)
    assert abs(noise.mean()) < 5 * 3.0 / math.sqrt(noise.size)


def test_noise_is_seeded_by_round():
    federation = make_federation()
    updates = updates_with_norms(global_state(federation), [1.0, 2.0])
    steps = []
    for round_idx in (3, 3, 4):
        before, after, _ = _step(DPFedAvg(noise_multiplier=1.0), federation, updates, round_idx=round_idx)
        steps.append(after["fc.weight"] - before["fc.weight"])
    assert torch.equal(steps[0], steps[1])
    assert not torch.allclose(steps[0], steps[2])


def test_no_noise_and_no_clipping_is_uniform_fedavg(federation):
    updates = updates_with_norms(global_state(federation), [0.5, 4.0, 30.0, 2.0])
    _, dp, _ = _step(DPFedAvg(noise_multiplier=0.0, clip_norm=math.inf), federation, updates)
    _, plain, _ = _step(FedAvg(weighting="uniform"), federation, updates)
    for name, value in plain.items():
        if value.is_floating_point():
            assert torch.equal(dp[name], value), name


def test_wraps_a_server_optimizer_with_the_noised_mean(federation):
    updates = updates_with_norms(global_state(federation), [1.0, 1.0, 1.0, 1.0])
    inner = FedAvg(server_optimizer=ServerSGD(lr=0.5, momentum=0.9))
    _, dp, _ = _step(DPFedAvg(noise_multiplier=0.0, clip_norm=5.0, algorithm=inner), federation, updates)
    _, plain, _ = _step(FedAvg(server_optimizer=ServerSGD(lr=0.5, momentum=0.9), weighting="uniform"), federation, updates)
    assert torch.equal(dp["fc.weight"], plain["fc.weight"])
    assert not torch.equal(dp["fc.weight"], global_state(federation)["fc.weight"])


def test_sharded_sums_equal_one_aggregate(federation):
    """The path of client sharding: partial clipped sums per rank, added, then one noised server step."""
    state = global_state(federation)
    updates = updates_with_norms(state, [0.5, 3.0, 1.0, 8.0])
    algorithm = DPFedAvg(noise_multiplier=0.7, clip_norm=1.5, adaptive_clipping=AdaptiveClipping(count_noise_std=1.0))
    _, whole, metrics = _step(algorithm, federation, updates, round_idx=2)

    sharded = DPFedAvg(noise_multiplier=0.7, clip_norm=1.5, adaptive_clipping=AdaptiveClipping(count_noise_std=1.0))
    sharded.setup(federation)
    parts = [sharded.weighted_delta_sum(updates[rank::2]) for rank in range(2)]
    total = {name: parts[0][0][name] + parts[1][0][name] for name in parts[0][0]}
    assert parts[0][1] + parts[1][1] == 2 - 4 / 2  # the centred unclipped count (2 of 4 fit) travels as the weight
    after = {k: v.clone() for k, v in state.items()}
    sharded_metrics = sharded.apply_weighted_sum(2, after, total, parts[0][1] + parts[1][1])

    for name, value in whole.items():
        torch.testing.assert_close(after[name], value, rtol=1e-6, atol=1e-6)
    assert sharded_metrics == pytest.approx(metrics) and sharded.clip_norm == algorithm.clip_norm


def test_epsilon_is_the_accountants_and_the_budget_stops_before_it_is_exceeded(federation):
    accountant = RoundAccountant(noise_multiplier=2.0, num_clients=4, clients_per_round=4, sampling="fixed", delta=1e-3)
    budget = (accountant.epsilon(2) + accountant.epsilon(3)) / 2
    algorithm = DPFedAvg(noise_multiplier=2.0, delta=1e-3, target_epsilon=budget)
    algorithm.setup(federation)
    updates = updates_with_norms(global_state(federation), [1.0, 1.0])
    epsilons = []
    assert algorithm.select_clients(0) == [0, 1, 2, 3]
    epsilons.append(algorithm.aggregate(0, global_state(federation), updates)["dp_epsilon"])
    assert algorithm.select_clients(1) == [0, 1, 2, 3]
    with pytest.warns(UserWarning, match="one more round would exceed target_epsilon"):
        epsilons.append(algorithm.aggregate(1, global_state(federation), updates)["dp_epsilon"])
    assert epsilons == [accountant.epsilon(1), accountant.epsilon(2)]
    assert not algorithm.budget_left and algorithm.select_clients(2) == []  # a third round would exceed it
    restored = DPFedAvg(noise_multiplier=2.0, delta=1e-3, target_epsilon=budget)
    restored.setup(make_federation())
    restored.load_state_dict(copy.deepcopy(algorithm.state_dict()))
    assert restored.rounds_spent == 2 and not restored.budget_left


def test_poisson_sampling_is_seeded_and_has_the_expected_size():
    federation = make_federation(clients_per_round=2)
    algorithm = DPFedAvg(noise_multiplier=1.0, sampling="poisson")
    algorithm.setup(federation)
    rounds = [algorithm.select_clients(r) for r in range(2000)]
    assert rounds[:5] == [algorithm.select_clients(r) for r in range(5)]
    # 2000 rounds of Binomial(4, 1/2): mean 2, std of the mean 0.022.
    assert np.mean([len(r) for r in rounds]) == pytest.approx(2.0, abs=0.1)
    assert len({tuple(r) for r in rounds}) == 16  # every subset of 4 clients occurs


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"target_epsilon": 0.0}, "target_epsilon"),
        ({"target_epsilon": -1.0}, "target_epsilon"),
        ({"delta": 0.0}, "delta"),
        ({"delta": 1.0}, "delta"),
        ({"delta": 1.5}, "delta"),
        ({"clip_norm": 0.0}, "clip_norm"),
        ({"clip_norm": -2.0}, "clip_norm"),
        ({"clip_norm": math.inf}, "clip_norm"),  # infinite sensitivity with noise
        ({"noise_multiplier": -0.5}, "noise_multiplier"),
        ({"sampling": "shuffle"}, "sampling"),
        ({"algorithm": FedBuff(buffer_size=2)}, "sum of client deltas"),
        ({"algorithm": FedALIGN(priority=1, epsilon=0.1)}, "selects its own clients"),
    ],
)
def test_bad_input_is_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DPFedAvg(**{"noise_multiplier": 1.0, **kwargs})


def test_budget_below_one_round_and_too_little_count_noise_are_refused(federation):
    with pytest.raises(ValueError, match="One round already spends"):
        DPFedAvg(noise_multiplier=0.5, target_epsilon=0.01).setup(federation)
    with pytest.raises(ValueError, match="count_noise_std"):
        DPFedAvg(noise_multiplier=1.0, adaptive_clipping=AdaptiveClipping(count_noise_std=0.4)).setup(make_federation())
