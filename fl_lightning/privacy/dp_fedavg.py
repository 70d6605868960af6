"""Central, user-level differential privacy over a weighted-sum algorithm (DP-FedAvg)."""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from typing_extensions import override

from fl_lightning.algorithms.shared.aggregation import weighted_sum
from fl_lightning.algorithms.shared.base import Algorithm, ClientUpdate
from fl_lightning.algorithms.fedavg import FedAvg
from fl_lightning.algorithms.shared.summable import aggregate_weighted_sum, can_shard
from fl_lightning.algorithms.shared.wrapper import AlgorithmWrapper
from fl_lightning.federation import Federation
from fl_lightning.model_state import State
from fl_lightning.privacy.accountant import RoundAccountant, Sampling, check_delta
from fl_lightning.privacy.adaptive_clipping import AdaptiveClipping
from fl_lightning.update_bounds import positive_finite, update_norm


class DPFedAvg(AlgorithmWrapper):
    r"""DP-FedAvg (McMahan et al. 2018, "Learning Differentially Private Recurrent Language Models",
    Algorithm 1) around any synchronous weighted-sum algorithm (FedAvg, FedProx, their server optimizers).

    Each round, every client's delta is clipped to L2 norm :math:`C`,
    :math:`\hat\Delta_k = \Delta_k \min(1, C / \lVert\Delta_k\rVert)`, and the server releases

    .. math:: \Delta_t = \frac{1}{m}\Big(\sum_k \hat\Delta_k + \mathcal N(0, z^2 C^2 I)\Big),

    the *fixed-denominator* estimator :math:`\tilde f_f` of McMahan et al. 2018 (§2, Algorithm 1,
    :math:`\sum_k w_k\Delta_k / (qW)` with weights :math:`w_k = 1`, so :math:`qW = m`, the configured
    ``clients_per_round``): the denominator never depends on who took part, so the sensitivity stays
    :math:`C`. The wrapped algorithm then applies :math:`\Delta_t` (``apply_weighted_sum`` with weight
    :math:`m`: its server optimizer, FedProx's client term). Its client weighting is replaced by
    these uniform weights; integer buffers (BatchNorm's ``num_batches_tracked``) are not released.

    Clients are sampled uniformly (``sampling="fixed"``: ``clients_per_round`` without replacement)
    or independently with probability :math:`q = m / N` (``"poisson"``), as the accountant
    (:class:`~fl_lightning.privacy.RoundAccountant`, Google's ``dp-accounting``) assumes; ε at
    ``delta`` is logged every round as ``round/dp_epsilon``. With ``target_epsilon`` no round
    that would take ε past it runs: the trainer stops (``trainer.should_stop``) after the last
    affordable round.

    Under client sharding each rank clips and sums its own clients; the noise is drawn once per
    round from a generator seeded by ``(seed, "dp_noise", round)`` after the all-reduce, the same
    draw on every rank, so N processes release what one does.

    Args:
        noise_multiplier: :math:`z \ge 0`; 0 adds no noise (ε = ∞).
        clip_norm: :math:`C > 0` (the initial value with ``adaptive_clipping``); ``math.inf`` only
            without noise.
        delta: :math:`\delta \in (0, 1)` at which ε is reported.
        target_epsilon: the ε budget (> 0); ``None`` trains for ``max_epochs`` rounds.
        sampling: ``"fixed"`` or ``"poisson"``.
        adaptive_clipping: adapts :math:`C` to a quantile of the update norms (Andrew et al. 2021).
        algorithm: the wrapped algorithm (default ``FedAvg(weighting="uniform")``); it must sum its
            clients' deltas (:class:`~fl_lightning.SummableAggregation`), or average its decoded deltas
            (FedMRN: each decoded masked-noise update :math:`G(s_k)\odot m_k` is what is clipped; no
            sharding then), and use the default uniform client selection.
    """

    summary_metrics: ClassVar[dict[str, str]] = {"dp_epsilon": "final"}

    accountant: RoundAccountant

    def __init__(
        self,
        *,
        noise_multiplier: float,
        clip_norm: float = 1.0,
        delta: float = 1e-5,
        target_epsilon: float | None = None,
        sampling: Sampling = "fixed",
        adaptive_clipping: AdaptiveClipping | None = None,
        algorithm: Algorithm | None = None,
    ) -> None:
        self.noise_multiplier = positive_finite("noise_multiplier", noise_multiplier, inclusive=True)
        if not (noise_multiplier == 0 and adaptive_clipping is None and clip_norm == math.inf):
            positive_finite("clip_norm", clip_norm)
        self.clip_norm = float(clip_norm)
        self.delta = check_delta(delta)
        self.target_epsilon = None if target_epsilon is None else positive_finite("target_epsilon", target_epsilon)
        if sampling not in ("fixed", "poisson"):
            raise ValueError(f"`sampling` must be 'fixed' or 'poisson', got {sampling!r}.")
        self.sampling = sampling
        self.adaptive_clipping = adaptive_clipping
        super().__init__(algorithm if algorithm is not None else FedAvg(weighting="uniform"))
        self._check_inner(self.inner)
        self.rounds_spent = 0

    @staticmethod
    def _check_inner(inner: Algorithm) -> None:
        name = type(inner).__name__
        if not inner.uploads_deltas:
            raise ValueError(
                f"DPFedAvg clips client deltas, but {name}'s uploads are not deltas (a whole model, or masks sampled "
                "from one): clipping them would not bound a client's influence on what is released; FedSoft also "
                "selects clients by their unnoised importance estimates, which no noise on the centres covers."
            )
        if not can_shard(inner):
            raise ValueError(
                f"DPFedAvg needs a synchronous algorithm whose aggregation is a sum of client deltas "
                f"(SummableAggregation: FedAvg, FedProx, their server optimizers) or a compressed FedAvg that "
                f"averages decoded deltas (FedMRN's masked noise, FedAvgSM); {name} is not."
            )
        if type(inner).select_clients is not Algorithm.select_clients:
            raise ValueError(f"DPFedAvg's accounting assumes uniform client sampling, but {name} selects its own clients.")

    @override
    def setup(self, federation: Federation) -> None:
        super().setup(federation)
        self.accountant = RoundAccountant(
            noise_multiplier=self.noise_multiplier,
            num_clients=federation.num_clients,
            clients_per_round=federation.clients_per_round,
            sampling=self.sampling,
            delta=self.delta,
        )
        if self.adaptive_clipping is not None:  # checks 2 sigma_b > z now rather than in round 0
            self.adaptive_clipping.update_noise_multiplier(self.noise_multiplier, federation.clients_per_round)
        if self.target_epsilon is not None and self.accountant.epsilon(1) > self.target_epsilon:
            raise ValueError(
                f"One round already spends epsilon={self.accountant.epsilon(1):.4g} > target_epsilon={self.target_epsilon}: "
                "raise noise_multiplier or target_epsilon, or lower clients_per_round."
            )

    @property
    @override
    def summable(self) -> bool:
        """Over a weighted sum: the clipped sum shards over processes (the noise is added after the all-reduce)."""
        return can_shard(self.inner)

    @property
    def budget_left(self) -> bool:
        """Whether one more round keeps ε within ``target_epsilon``."""
        return self.target_epsilon is None or self.accountant.epsilon(self.rounds_spent + 1) <= self.target_epsilon

    @override
    def select_clients(self, round_idx: int) -> list[int]:
        """Uniform sampling as accounted for; no client once the budget is spent (nothing is released)."""
        if not self.budget_left:
            self.federation.services.request_stop()
            return []
        if self.sampling == "fixed":
            return super().select_clients(round_idx)
        fed = self.federation
        joins = torch.rand(fed.num_clients, generator=fed.generator("select", round_idx), dtype=torch.float64)
        return torch.nonzero(joins < fed.clients_per_round / fed.num_clients).flatten().tolist()

    @override
    def aggregate(self, round_idx: int, global_state: State, updates: list[ClientUpdate]) -> dict[str, float]:
        return aggregate_weighted_sum(self, round_idx, global_state, updates)

    @override
    def weighted_delta_sum(self, updates: list[ClientUpdate]) -> tuple[State, float]:
        r""":math:`(\sum_k \hat\Delta_k, \sum_k b_k)`: the clipped deltas' sum (integer tensors zeroed) and
        the number of updates that fit unclipped, :math:`b_k = \mathbb 1[\lVert\Delta_k\rVert \le C]`,
        the one per-client scalar the server step reads (Andrew et al. 2021's clipped count)."""
        total, unclipped = clipped_sum([u.payload for u in updates], self.clip_norm)
        return total, float(unclipped)

    @override
    def apply_weighted_sum(self, round_idx: int, global_state: State, total: State, weight: float) -> dict[str, float]:
        """Adds the round's seeded Gaussian noise to the clipped sum ``total`` and lets the wrapped algorithm
        apply its mean over the expected clients; ``weight`` is the unclipped count (:meth:`weighted_delta_sum`)."""
        clip_norm, expected = self.clip_norm, float(self.federation.clients_per_round)
        multiplier = self.update_noise_multiplier()
        noise_std = multiplier * clip_norm if multiplier > 0 else 0.0  # no noise stays 0 with C = inf
        released = [name for name, target in global_state.items() if target.is_floating_point()]  # the same draws on every rank
        add_noise(total, released, noise_std, self.federation.generator("dp_noise", round_idx))
        metrics = self.inner.apply_weighted_sum(round_idx, global_state, total, expected)
        self.rounds_spent += 1
        metrics.update(dp_epsilon=self.accountant.epsilon(self.rounds_spent), dp_clip_norm=clip_norm, dp_noise_std=noise_std)
        if self.adaptive_clipping is not None:
            count_generator = self.federation.generator("dp_count_noise", round_idx)
            self.clip_norm, metrics["dp_unclipped_fraction"] = self.adaptive_clipping.next_clip_norm(
                clip_norm, weight, expected, count_generator
            )
        if not self.budget_left:
            rank_zero_warn(
                f"Round {round_idx}: epsilon={metrics['dp_epsilon']:.4g}; one more round would exceed "
                f"target_epsilon={self.target_epsilon}, so training stops."
            )
            self.federation.services.request_stop()
        return metrics

    def update_noise_multiplier(self) -> float:
        """The noise multiplier on the update: :math:`z`, or :math:`z_\\Delta` with adaptive clipping."""
        if self.adaptive_clipping is None:
            return self.noise_multiplier
        return self.adaptive_clipping.update_noise_multiplier(self.noise_multiplier, self.federation.clients_per_round)

    @override
    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "clip_norm": self.clip_norm, "rounds_spent": self.rounds_spent}

    @override
    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.clip_norm, self.rounds_spent = float(state["clip_norm"]), int(state["rounds_spent"])


def clipped_sum(payloads: list[State], clip_norm: float) -> tuple[State, int]:
    r""":math:`\sum_k \Delta_k \min(1, C/\lVert\Delta_k\rVert)` (integer tensors zeroed: not released) and the
    number of payloads that fit unclipped, :math:`\sum_k \mathbb 1[\lVert\Delta_k\rVert \le C]`."""
    norms = [update_norm(p) for p in payloads]
    total = weighted_sum(payloads, [min(1.0, clip_norm / norm) if norm > 0 else 1.0 for norm in norms])
    for name, value in payloads[0].items():
        if not value.is_floating_point():
            total[name].zero_()
    return total, sum(norm <= clip_norm for norm in norms)


def add_noise(total: State, names: list[str], std: float, generator: torch.Generator) -> None:
    r"""Adds :math:`\mathcal N(0, \mathrm{std}^2)` to ``total[name]`` in place, for the ``names`` it holds, in their
    order (so the draws are reproducible); nothing when ``std`` is 0."""
    for name in names:
        if std > 0 and name in total:
            noise = torch.randn(total[name].shape, generator=generator, dtype=torch.float64)
            total[name].add_(noise.mul_(std).to(total[name]))
