"""DP-FTRL (Kairouz et al. 2021): the tree's node partition, released models against an independent tree
reference, one participation per epoch, ε against the paper's zCDP bound, and a fit through the trainer."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fl_lightning import FedAvg, FederatedTrainer, ServerSGD
from fl_lightning.data import Digits, FederatedDataModule
from fl_lightning.models import MLP
from fl_lightning.privacy import DPFTRL
from fl_lightning.privacy.noise import noise_source
from fl_lightning.privacy.tree_aggregation import prefix_nodes, residual_nodes
from tests.privacy.conftest import global_state, make_federation, updates_with_norms
from tests.privacy.reference import analytic_gaussian_epsilon
from tests.quiet import QUIET


def _segment_nodes(t: int, depth: int = 12) -> list[tuple[int, int]]:
    """The canonical decomposition of [1, t] in a complete binary tree over [1, 2**depth], by recursion from the
    root (the textbook segment-tree query): an independent way to name the nodes a prefix sum reads."""

    def visit(level: int, index: int) -> list[tuple[int, int]]:
        lo, hi = index * 2**level + 1, (index + 1) * 2**level
        if lo > t:
            return []
        if hi <= t:
            return [(level, index)]
        return visit(level - 1, 2 * index) + visit(level - 1, 2 * index + 1)

    return sorted(visit(depth, 0)) if t else []


def test_prefix_nodes_are_the_binary_trees_canonical_cover_of_the_steps():
    for t in range(0, 600):
        nodes = prefix_nodes(t)
        assert sorted(nodes) == _segment_nodes(t), t
        assert len(nodes) == bin(t).count("1") <= math.ceil(math.log2(t + 1))
        steps = sorted(s for level, index in nodes for s in range(index * 2**level + 1, (index + 1) * 2**level + 1))
        assert steps == list(range(1, t + 1))
        if t:
            added, removed = residual_nodes(t)
            assert sorted(set(prefix_nodes(t - 1)) - set(removed) | set(added)) == sorted(nodes)


def _node_noise(seed: int, tree_start: int, node: tuple[int, int], state: dict[str, torch.Tensor], std: float):
    source = noise_source(None, seed, "dp_ftrl", tree_start, *node)
    return {k: source.normal(v.shape).mul_(std).double() for k, v in state.items() if v.is_floating_point()}


def test_each_released_model_is_theta0_plus_the_prefix_sum_with_its_trees_noise():
    """Kairouz et al. 2021, Alg. 1 with server SGD (lr 1): θ_t = θ_0 + (Σ_{τ≤t} g_τ + Σ_e Σ_{n ∈ nodes(T_e(t))} ξ_{e,n}) / m,
    each epoch's tree over its own rounds (4 clients, 1 per round: 4 rounds an epoch)."""
    federation = make_federation(clients_per_round=1, seed=3)
    z, clip = 0.7, 1.5
    algorithm = DPFTRL(
        noise_multiplier=z, clip_norm=clip, algorithm=FedAvg(weighting="uniform", server_optimizer=ServerSGD(lr=1.0))
    )
    algorithm.setup(federation)
    theta0 = global_state(federation)
    state = {k: v.clone() for k, v in theta0.items()}
    clipped_total = {k: torch.zeros_like(v, dtype=torch.float64) for k, v in theta0.items() if v.is_floating_point()}
    for t in range(11):
        norms = [0.3 + 0.5 * t]  # some under the clip norm, most over
        updates = updates_with_norms(theta0, norms, seed=t)
        algorithm.aggregate(t, state, updates)
        for k in clipped_total:
            clipped_total[k] += updates[0].payload[k].double() * min(1.0, clip / norms[0])
        expected = {k: v.clone() for k, v in clipped_total.items()}
        for epoch in range(t // 4 + 1):
            steps = min(t + 1, 4 * (epoch + 1)) - 4 * epoch
            for node in _segment_nodes(steps):
                for k, xi in _node_noise(3, 4 * epoch, node, theta0, z * clip).items():
                    expected[k] += xi
        for k, value in expected.items():
            torch.testing.assert_close(
                (state[k].double() - theta0[k].double()), value, rtol=1e-5, atol=1e-5, msg=f"round {t}: {k}"
            )
    assert algorithm.trees == [(0, 0, 4), (1, 4, 4), (2, 8, 3)]


def test_each_client_takes_part_at_most_once_per_epoch_and_leftovers_skip_it():
    federation = make_federation(clients_per_round=3, seed=1)  # 4 clients: 1 round an epoch, one client skips
    algorithm = DPFTRL(noise_multiplier=1.0)
    algorithm.setup(federation)
    rounds = [algorithm.select_clients(r) for r in range(6)]
    assert all(len(clients) == 3 == len(set(clients)) for clients in rounds)
    assert len({tuple(c) for c in rounds}) > 1  # the permutation changes with the epoch


def _zcdp_epsilon(rho: float, delta: float) -> float:
    """ε of ρ-zCDP (RDP αρ at every α) at δ, by the conversion of Canonne, Kamath and Steinke 2020 (Prop. 12) over a
    dense grid of orders, written here from the formula: an independent reference for the accountant."""
    alphas = np.concatenate([np.linspace(1.02, 10, 4000), np.linspace(10, 5000, 20000)])
    eps = alphas * rho + np.log1p(-1 / alphas) - np.log(delta * alphas) / (alphas - 1)
    return float(eps.min())


@pytest.mark.parametrize(
    ("z", "epochs", "delta"), [(1.0, [[4]], 1e-5), (0.8, [[100], [100], [37]], 1e-6), (3.0, [[1000]] * 5, 1e-5)]
)
def test_epsilon_is_the_papers_zcdp_bound_composed_over_epochs(z, epochs, delta):
    """Kairouz et al. 2021, Appendix D: an epoch's tree of T steps is ⌈log2(T+1)⌉/(2z²)-zCDP; epochs compose."""
    federation = make_federation(clients_per_round=1)
    algorithm = DPFTRL(noise_multiplier=z, delta=delta)
    algorithm.setup(federation)
    algorithm.trees = [(e, 0, steps) for e, trees in enumerate(epochs) for steps in trees]
    rho = sum(math.ceil(math.log2(max(trees) + 1)) / (2 * z**2) for trees in epochs)
    reference = _zcdp_epsilon(rho, delta)
    assert reference <= algorithm.epsilon() <= reference * 1.01


@pytest.mark.parametrize("z", [0.8, 1.3, 4.0])
def test_a_one_round_tree_is_one_gaussian_release_and_never_below_its_exact_epsilon(z):
    """T = 1: one node, the Gaussian mechanism at multiplier z; RDP's ε is above the exact value, and close."""
    algorithm = DPFTRL(noise_multiplier=z, delta=1e-5)
    algorithm.setup(make_federation(clients_per_round=4))
    algorithm.trees = [(0, 0, 1)]
    exact = analytic_gaussian_epsilon(z, 1e-5)
    assert exact <= algorithm.epsilon() <= 1.5 * exact


def test_bad_input_is_one_error_naming_it():
    with pytest.raises(ValueError, match="noise_multiplier"):
        DPFTRL(noise_multiplier=-1.0)
    with pytest.raises(ValueError, match="clip_norm"):
        DPFTRL(noise_multiplier=1.0, clip_norm=0.0)
    with pytest.raises(ValueError, match="delta"):
        DPFTRL(noise_multiplier=1.0, delta=1.5)
    algorithm = DPFTRL(noise_multiplier=1.0)
    algorithm.setup(make_federation(clients_per_round=1))
    with pytest.raises(ValueError, match="trees"):
        algorithm.load_state_dict({**algorithm.state_dict(), "trees": [[0, 0, 3], [0, 2, 1]]})


def test_a_fit_logs_epsilon_and_resumes_bit_exact(tmp_path):
    def fit(rounds: int, root: str, ckpt_path: str | None = None) -> tuple[FederatedTrainer, dict[str, torch.Tensor]]:
        torch.manual_seed(0)
        data = FederatedDataModule(Digits(split="train"), num_clients=20, batch_size=16, seed=0)
        trainer = FederatedTrainer(
            **{**QUIET, "enable_checkpointing": True},
            default_root_dir=tmp_path / root,
            algorithm=DPFTRL(noise_multiplier=1.0, clip_norm=0.5, delta=1e-3),
            clients_per_round=5,
            max_epochs=rounds,
            limit_val_batches=0,
            seed=0,
        )
        trainer.fit(MLP(in_features=64, hidden=(16,), lr=0.1), datamodule=data, ckpt_path=ckpt_path)
        return trainer, {k: v.clone() for k, v in trainer.fit_loop.global_state.items()}

    uninterrupted, weights = fit(6, "uninterrupted")
    history = uninterrupted.fit_loop.history
    for epoch in (history[:4], history[4:]):  # 20 clients, 5 a round: 4 rounds an epoch
        ids = [c for clients in epoch for c in clients]
        assert len(ids) == len(set(ids))
    assert uninterrupted.algorithm.trees == [(0, 0, 4), (1, 4, 2)]
    assert uninterrupted.callback_metrics["round/dp_epsilon"] == pytest.approx(uninterrupted.algorithm.epsilon())

    interrupted, _ = fit(3, "interrupted")
    assert interrupted.algorithm.trees == [(0, 0, 3)]
    resumed, resumed_weights = fit(6, "resumed", ckpt_path=str(tmp_path / "interrupted" / "checkpoints" / "last.ckpt"))
    assert resumed.algorithm.trees == uninterrupted.algorithm.trees
    for name, value in weights.items():
        assert torch.equal(resumed_weights[name], value), name
