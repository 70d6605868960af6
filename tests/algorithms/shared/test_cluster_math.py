"""Pure functions of FedSoft and IFCA: importance weights, eq. 6, selection, averaging, matching."""

from __future__ import annotations

import pytest
import torch

from fl_lightning.algorithms.shared.cluster_math import (
    aggregation_weights,
    average_states,
    importance_weights,
    match_clusters,
    select_per_cluster,
)
from fl_lightning.data import SyntheticRegressionMixture

SIGMA = 1e-4


def oracle_losses(data: SyntheticRegressionMixture, idx: torch.Tensor) -> torch.Tensor:
    """[n, S] squared errors of the true coefficients on the samples ``idx``."""
    x, y = data.tensors[0][idx], data.tensors[1][idx]
    return (x @ data.thetas.T - y) ** 2


@pytest.mark.parametrize("pattern", ["10:90", "30:70", "linear", "random"])
def test_noise_free_oracle_centres_recover_the_true_proportions_exactly(pattern):
    data = SyntheticRegressionMixture(num_clients=12, pattern=pattern, noise_std=0.0, seed=3)
    for cid in range(12):
        idx = torch.from_numpy((data.client_ids == cid).nonzero()[0])
        truth = torch.bincount(torch.from_numpy(data.source_ids[idx.numpy()]), minlength=2).double() / len(idx)
        assert torch.equal(importance_weights(oracle_losses(data, idx), SIGMA), truth.clamp_min(SIGMA))


def test_absent_source_gets_sigma_and_no_renormalisation():
    data = SyntheticRegressionMixture(num_sources=3, num_clients=2, pattern="0:100", noise_std=0.0, seed=0)
    idx = torch.from_numpy((data.client_ids == 0).nonzero()[0])
    u = importance_weights(oracle_losses(data, idx), 0.01)
    assert u.tolist() == [1.0, 0.01, 0.01]  # sums to 1.02: not renormalised


def test_identical_centres_send_every_sample_to_the_first():
    assert importance_weights(torch.ones(7, 3), 0.05).tolist() == [1.0, 0.05, 0.05]


def test_importance_rejects_bad_shapes():
    with pytest.raises(ValueError, match=r"shape \[n, S\]"):
        importance_weights(torch.ones(4), 0.1)


def test_aggregation_weights_are_normalised_over_all_clients_not_the_selected():
    u = torch.tensor([[0.9, 0.1], [0.5, 0.5], [1e-4, 1.0], [0.3, 0.7]], dtype=torch.float64)
    n = torch.tensor([100.0, 150.0, 120.0, 200.0], dtype=torch.float64)
    v = aggregation_weights(u, n)
    expected = u * n[:, None] / (u * n[:, None]).sum(dim=0)  # eq. 6 over k' in [N]
    torch.testing.assert_close(v, expected, rtol=0, atol=1e-15)
    torch.testing.assert_close(v.sum(dim=0), torch.ones(2, dtype=torch.float64))
    # The typo's denominator (sum over a selected subset, e.g. clients 0 and 1) gives other values.
    typo = u[:2, 0] * n[:2] / (u[:2, 0] * n[:2]).sum()
    assert not torch.allclose(v[:2, 0], typo)


def test_a_column_at_sigma_everywhere_weights_clients_by_size_and_sigma_clients_vanish():
    n = [100, 300]
    v = aggregation_weights(torch.tensor([[1.0, SIGMA], [1.0, SIGMA]]), n)
    torch.testing.assert_close(v[:, 1], torch.tensor([0.25, 0.75], dtype=torch.float64))
    v = aggregation_weights(torch.tensor([[1.0, SIGMA], [0.0, 1.0]]), n)
    assert v[0, 1] < 1e-3


def test_selection_is_deterministic_distinct_and_of_size_k():
    v = aggregation_weights(torch.rand(30, 3, generator=torch.Generator().manual_seed(0)) + 0.01, torch.full((30,), 100.0))
    first = select_per_cluster(v, 10, torch.Generator().manual_seed(5))
    assert first == select_per_cluster(v, 10, torch.Generator().manual_seed(5))
    assert first != select_per_cluster(v, 10, torch.Generator().manual_seed(6))
    assert all(len(sel) == 10 == len(set(sel)) for sel in first)


def test_selection_with_replacement_may_repeat_and_follows_v():
    v = torch.tensor([[0.97, 0.01], [0.01, 0.01], [0.01, 0.01], [0.01, 0.97]], dtype=torch.float64)
    sel = select_per_cluster(v, 4, torch.Generator().manual_seed(0), replace=True)
    assert len(sel[0]) == 4 and sel[0].count(0) >= 2 and sel[1].count(3) >= 2


@pytest.mark.parametrize("k", [0, 5])
def test_selection_rejects_k_outside_the_client_count(k):
    with pytest.raises(ValueError, match=rf"Cannot select k={k} clients per cluster out of 4: k must be in 1..4"):
        select_per_cluster(torch.full((4, 2), 0.25), k, torch.Generator())


def test_average_states_is_uniform_and_rounds_counters():
    states = [{"w": torch.tensor([1.0, 0.0]), "n": torch.tensor(3)}, {"w": torch.tensor([2.0, 4.0]), "n": torch.tensor(6)}]
    mean = average_states(states)
    assert torch.equal(mean["w"], torch.tensor([1.5, 2.0])) and mean["n"].dtype == torch.int64 and int(mean["n"]) == 4
    assert torch.equal(average_states(states + [states[1]])["w"], torch.tensor([5 / 3, 8 / 3]))


def test_match_clusters_finds_the_best_relabelling():
    truth = torch.tensor([[0.9, 0.1, 0.0], [0.2, 0.2, 0.6], [0.0, 1.0, 0.0]])
    estimate = truth[:, [2, 0, 1]]  # centre 0 stands for source 2, 1 for 0, 2 for 1
    error, perm = match_clusters(estimate, truth)
    assert error == 0.0 and perm == [2, 0, 1]
    error, _ = match_clusters(estimate + 0.05, truth)
    assert error == pytest.approx(0.05)
