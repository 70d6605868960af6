r"""DP-FTRL: differentially private federated training without sampling amplification (tree aggregation)."""

from __future__ import annotations

from typing import Any

import torch
from lightning.pytorch.utilities.rank_zero import rank_zero_info
from typing_extensions import override

from fl_lightning.algorithms.fedavg import FedAvg
from fl_lightning.algorithms.shared.algorithm import Algorithm, ClientUpdate
from fl_lightning.algorithms.shared.summable import can_shard
from fl_lightning.data._data_checks import check_bool
from fl_lightning.privacy.accountant import check_delta
from fl_lightning.privacy.calibration import calibrate_noise_multiplier, noise_request
from fl_lightning.privacy.central_sum import CentralSumMechanism
from fl_lightning.privacy.dp_fedavg import add_noise, clipped_sum, zero_sum
from fl_lightning.privacy.noise import check_secure_mode, noise_source, start_noise
from fl_lightning.privacy.tree_aggregation import residual_nodes, tree_epsilon
from fl_lightning.robust.update_bounds import positive_finite
from fl_lightning.server.federation import Federation
from fl_lightning.server.model_state import State
from fl_lightning.utils.seeding import make_generator

#: A tree of the run: (epoch, first round, rounds released in it).
Tree = tuple[int, int, int]


class DPFTRL(CentralSumMechanism):
    r"""DP-FTRL (Kairouz et al. 2021, "Practical and Private (Deep) Learning without Sampling or Shuffling",
    Algorithm 1; the mechanism of Gboard's production DP training, Xu et al. 2023) around a weighted-sum algorithm.

    Each round :math:`t` the clients' deltas are clipped to L2 norm :math:`C` and summed,
    :math:`g_t = \sum_k \hat\Delta_k`, and the server releases the tree-aggregated prefix sum
    :math:`s_t = \sum_{\tau \le t} g_\tau + \sum_{n \in \mathrm{nodes}(t)} \xi_n`, each tree node's noise
    :math:`\xi_n \sim \mathcal N(0, z^2 C^2 I)` (:mod:`~fl_lightning.privacy.tree_aggregation`). The wrapped
    algorithm applies :math:`(s_t - s_{t-1}) / m` (``apply_weighted_sum`` with weight :math:`m`, the configured
    ``clients_per_round``): with server SGD of rate :math:`\eta` the model is :math:`\theta_0 + \eta s_t / m`,
    FTRL with :math:`\lambda = m/\eta` (Algorithm 1); with server momentum (``FedAvg(server_optimizer=...)``),
    DP-FTRLM (§4, the paper's recommended variant).

    No sampling amplification is claimed, so the clients need no secret sampling: every epoch, a seeded
    permutation of the clients is cut into rounds of :math:`m`, so each client takes part at most once per
    epoch (:math:`\lfloor N/m \rfloor` rounds; the last :math:`N \bmod m` of the permutation skip that epoch), and
    the tree restarts at every epoch. ε at ``delta`` (``round/dp_epsilon``) composes the epochs' trees, each
    :math:`\lceil\log_2(T+1)\rceil / (2z^2)`-zCDP under replace-with-zero neighbours (one client's data
    replaced by a zero update: Definition 1.1, Appendix D).

    Noise: node :math:`(l, i)` of the tree started at round :math:`r_0` is drawn from
    ``(seed, "dp_ftrl", r_0, l, i)`` (research mode: reproducible and bit-exact on resume, with a warning that
    the seed strips it) or from a secret in ``secure_mode``. A secure-mode resume draws a new secret, so it
    restarts the tree at its first round (the old nodes' noise is gone with the old secret); the accounting
    then counts that epoch's trees, each client still at most once across them.

    Args:
        noise_multiplier: :math:`z \ge 0`, the noise of each tree node over :math:`C`; 0 adds none (ε = ∞).
        target_epsilon: instead of ``noise_multiplier``: the ε to reach at ``delta`` over the run's ``max_epochs``
            rounds; the smallest such :math:`z` is found at set-up (:mod:`~fl_lightning.privacy.calibration`) and logged.
        clip_norm: :math:`C > 0`.
        delta: :math:`\delta \in (0, 1)` at which ε is reported.
        secure_mode: draw the noise from a secret never logged or saved.
        log_client_statistics: also log the unnoised client statistics (as :class:`~fl_lightning.DPFedAvg`).
        algorithm: the wrapped weighted-sum algorithm (default ``FedAvg(weighting="uniform")``; its server
            optimizer applies the released sums).
    """

    accountant_name = "zCDP"
    neighbouring_relation = "replace-with-zero"

    def __init__(
        self,
        *,
        noise_multiplier: float | None = None,
        clip_norm: float = 1.0,
        delta: float = 1e-5,
        target_epsilon: float | None = None,
        secure_mode: bool = False,
        log_client_statistics: bool = False,
        algorithm: Algorithm | None = None,
    ) -> None:
        if (noise_multiplier is None) == (target_epsilon is None):
            raise ValueError(
                f"DPFTRL needs exactly one of `noise_multiplier` and `target_epsilon` (which calibrates it), got "
                f"noise_multiplier={noise_multiplier!r}, target_epsilon={target_epsilon!r}."
            )
        self.noise_multiplier, self.target_epsilon = noise_request("DPFTRL", noise_multiplier, target_epsilon)
        self.clip_norm = positive_finite("clip_norm", clip_norm)
        self.delta = check_delta(delta)
        self.secure_mode = check_secure_mode(secure_mode)
        self.log_client_statistics = check_bool("log_client_statistics", log_client_statistics)
        super().__init__(algorithm if algorithm is not None else FedAvg(weighting="uniform"))
        _check_inner(self.inner)
        #: The trees released so far, in order: (epoch, first round, rounds).
        self.trees: list[Tree] = []
        self._secret: bytes | None = None
        self._restart_at_next_round = False

    @override
    def setup(self, federation: Federation) -> None:
        super().setup(federation)
        self.rounds_per_epoch = federation.num_clients // federation.clients_per_round
        if self.target_epsilon is not None:
            self.noise_multiplier = self._calibrated(federation.num_rounds)
        self._secret = start_noise("DPFTRL", self.secure_mode)

    def _calibrated(self, rounds: int | None) -> float:
        """The smallest :math:`z` whose ε over the run's rounds (full epochs, then the rest) is at most ``target_epsilon``."""
        if rounds is None:
            raise ValueError("DPFTRL(target_epsilon=...) calibrates noise_multiplier over the run's rounds: set max_epochs.")
        epochs, rest = divmod(rounds, self.rounds_per_epoch)
        trees = [[self.rounds_per_epoch]] * epochs + ([[rest]] if rest else [])
        what = f"{rounds} rounds ({len(trees)} epochs of trees)"
        z = calibrate_noise_multiplier(lambda z: tree_epsilon(z, trees, self.delta), self.target_epsilon, what)  # type: ignore[arg-type]
        rank_zero_info(
            f"DPFTRL: noise_multiplier={z:.4g}, the smallest with epsilon <= {self.target_epsilon} at delta={self.delta:g} over {what}."
        )
        return z

    @override
    def select_clients(self, round_idx: int) -> list[int]:
        """Round ``round_idx``'s share of its epoch's seeded permutation: each client at most once per epoch."""
        fed = self.federation
        epoch, position = divmod(round_idx, self.rounds_per_epoch)
        order = torch.randperm(fed.num_clients, generator=make_generator(fed.seed, "dp_ftrl_order", epoch))
        m = fed.clients_per_round
        return sorted(order[position * m : (position + 1) * m].tolist())

    @override
    def aggregate(self, round_idx: int, global_state: State, updates: list[ClientUpdate]) -> dict[str, float]:
        r"""Releases :math:`s_t - s_{t-1}` (the clipped sum plus the tree's residual noise) through the wrapped
        algorithm, and counts the round in its tree."""
        total = clipped_sum([u.payload for u in updates], self.clip_norm)[0] if updates else zero_sum(global_state)
        epoch, start = self._tree_of(round_idx)
        step = round_idx - start + 1
        std = self.noise_multiplier * self.clip_norm
        released = [name for name, target in global_state.items() if target.is_floating_point()]
        added, removed = residual_nodes(step)
        for sign, nodes in ((1.0, added), (-1.0, removed)):
            for level, index in nodes:
                source = noise_source(self._secret, self.federation.seed, "dp_ftrl", start, level, index)
                add_noise(total, released, std, source, sign)
        metrics = self.inner.apply_weighted_sum(round_idx, global_state, total, float(self.federation.clients_per_round))
        self._count(epoch, start)
        metrics.update(dp_epsilon=self.epsilon(), dp_clip_norm=self.clip_norm, dp_noise_std=std)
        return metrics

    @override
    def epsilon(self) -> float:
        """ε at ``delta`` of the trees released so far (:func:`~fl_lightning.privacy.tree_aggregation.tree_epsilon`)."""
        epochs: dict[int, list[int]] = {}
        for epoch, _, rounds in self.trees:
            epochs.setdefault(epoch, []).append(rounds)
        return tree_epsilon(self.noise_multiplier, list(epochs.values()), self.delta)

    def _tree_of(self, round_idx: int) -> tuple[int, int]:
        """(epoch, first round) of the tree round ``round_idx`` belongs to: its epoch's first round, or a later
        restart in that epoch (a secure-mode resume)."""
        epoch = round_idx // self.rounds_per_epoch
        if self._restart_at_next_round:
            self._restart_at_next_round = False
            return epoch, round_idx
        starts = [start for e, start, _ in self.trees if e == epoch and start <= round_idx]
        return epoch, max(starts, default=epoch * self.rounds_per_epoch)

    def _count(self, epoch: int, start: int) -> None:
        if self.trees and self.trees[-1][:2] == (epoch, start):
            self.trees[-1] = (epoch, start, self.trees[-1][2] + 1)
        else:
            self.trees.append((epoch, start, 1))

    @override
    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "trees": [list(t) for t in self.trees]}

    @override
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restores the trees released (checked: counts, rounds in order, one epoch's rounds each); in secure mode the
        next round starts a new tree (the old nodes' noise went with the old secret)."""
        super().load_state_dict(state)
        trees = state["trees"]
        if not isinstance(trees, list) or not all(
            isinstance(t, list) and len(t) == 3 and all(type(v) is int and v >= 0 for v in t) and t[2] > 0 for t in trees
        ):
            raise ValueError(f"DPFTRL's `trees` must be a list of [epoch, first round, rounds >= 1] integers, got {trees!r}.")
        ends = [start + rounds for _, start, rounds in trees]
        if any(start < end for (_, start, _), end in zip(trees[1:], ends)):
            raise ValueError(f"DPFTRL's `trees` overlap or go back in time: {trees!r}.")
        self.trees = [(e, s, r) for e, s, r in trees]
        self._restart_at_next_round = self.secure_mode and bool(self.trees)


def _check_inner(inner: Algorithm) -> None:
    name = type(inner).__name__
    if not inner.uploads_deltas or not can_shard(inner):
        raise ValueError(
            f"DPFTRL clips and sums client deltas, so it needs a synchronous algorithm whose aggregation is a sum of "
            f"client deltas (FedAvg, FedProx, their server optimizers); {name} is not."
        )
    if type(inner).select_clients is not Algorithm.select_clients:
        raise ValueError(f"DPFTRL picks each epoch's clients itself (each at most once), but {name} selects its own clients.")
