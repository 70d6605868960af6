"""IFCA (Ghosh et al. 2020): cluster identity by lowest loss, training from the chosen centre, per-cluster averaging."""

from __future__ import annotations

import pytest
import torch

from fl_lightning import IFCA, FederatedCallback
from fl_lightning.data import SyntheticRegressionMixture

from .test_fedsoft import N, fit, mixture_data, oracle_centres


class Recorder(FederatedCallback):
    def __init__(self) -> None:
        self.payloads: dict[int, dict[str, torch.Tensor]] = {}

    def on_client_end(self, trainer, pl_module, client, update) -> None:
        self.payloads[client.client_id] = {k: v.clone() for k, v in update.payload.items()}


def test_clients_pick_their_majority_source_and_centres_move_by_their_members_mean_delta():
    data = mixture_data(pattern="10:90")
    recorder = Recorder()
    centres = oracle_centres(data)
    algorithm = IFCA(num_clusters=2, centres=centres)
    fit(algorithm, rounds=1, data=data, callbacks=[recorder])
    # clients 0..3 draw 90 % from source 0, clients 4..7 90 % from source 1
    assert algorithm.assignment == {c: int(c >= N // 2) for c in range(N)}
    for j in range(2):
        members = [recorder.payloads[c]["net.weight"] for c in range(N) if algorithm.assignment[c] == j]
        expected = centres[j]["net.weight"] + torch.stack(members).mean(dim=0)
        torch.testing.assert_close(algorithm.centres[j]["net.weight"], expected, rtol=0, atol=1e-6)


def test_a_centre_nobody_picks_is_unchanged():
    data = mixture_data(pattern="0:100")  # clients 0..3 only source 0, 4..7 only source 1
    far = {"net.weight": torch.full((1, 10), 1e3)}
    algorithm = IFCA(num_clusters=3, centres=[*oracle_centres(data), far])
    fit(algorithm, rounds=2, data=data)
    assert torch.equal(algorithm.centres[2]["net.weight"], far["net.weight"])


def test_hard_clusters_are_recovered():
    data = mixture_data(pattern="0:100", noise_std=0.1)
    algorithm = IFCA(num_clusters=2, evaluate_sources=True)
    _, trainer = fit(algorithm, rounds=12, data=data, lr=0.2)
    metrics = trainer.callback_metrics
    assert metrics["round/u_error"] == 0.0  # every client on its own source's centre
    for s in range(2):
        source = int(metrics[f"round/c{s}_source"])
        own, other = metrics[f"round/src{source}_c{s}_loss"], metrics[f"round/src{1 - source}_c{s}_loss"]
        assert own < 0.2 * other, (own, other)


def test_bad_input():
    with pytest.raises(ValueError, match=r"number of clusters S \(`num_clusters`\) must be an int >= 1, got 0"):
        IFCA(num_clusters=0)
    with pytest.raises(ValueError, match="`weighting` must be 'uniform' or 'samples'"):
        IFCA(weighting="size")
    with pytest.raises(ValueError, match="Got 1 initial centres for num_clusters=2"):
        IFCA(num_clusters=2, centres=[{"w": torch.zeros(1)}])


def test_regression_mixture_exposes_true_centres():
    data = SyntheticRegressionMixture(num_clients=4, samples_per_client=5)
    assert data.thetas.shape == (2, 10)
