"""FedBuff (Nguyen et al. 2022): buffered asynchronous aggregation, as the FedStaleWeight paper
uses it (§3.1, "buffered FedAvg"), run on :class:`~fl_lightning.loops.AsyncFitLoop`."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import numpy as np
from typing_extensions import override

from fl_lightning.algorithms.shared.aggregation import apply_delta, weighted_sum
from fl_lightning.algorithms.shared.asynchronous import AsyncAlgorithm, PullPolicy, TrainAt
from fl_lightning.algorithms.shared.algorithm import ClientUpdate
from fl_lightning.algorithms.shared.combinable import Combine
from fl_lightning.server.model_state import State
from fl_lightning.participation.speed import DelayModel
from fl_lightning.utils.checks import check_integer, optional, positive

Discount = Literal["constant", "inverse", "inverse_sqrt"]

_DISCOUNTS = {
    "constant": lambda s: 1.0,
    "inverse": lambda s: 1.0 / (1.0 + s),
    "inverse_sqrt": lambda s: 1.0 / math.sqrt(1.0 + s),
}


class FedBuff(AsyncAlgorithm):
    r"""Buffered asynchronous FL: every ``buffer_size`` arrivals the server applies
    :math:`w \leftarrow w + \eta_g \sum_{j \in B} \alpha_j \Delta_j` and the model version increments.

    FedBuff's weights are :math:`\alpha_j = s(\tau_j)/b` with the staleness discount :math:`s`
    (constant 1 by default, as the FedStaleWeight paper's baseline; or :math:`1/(1+\tau)`,
    :math:`1/\sqrt{1+\tau}`), not renormalised, as in the original FedBuff; updates staler than
    ``max_staleness`` get weight 0.

    The simulation (on a virtual clock, see :class:`~fl_lightning.loops.AsyncFitLoop`):
    ``concurrency`` clients are in flight; a client trains at dispatch from the current model
    (its update is computed then) and arrives after a duration drawn from ``delays``. When a
    client arrives it re-pulls (all clients in flight, the paper's setting) or, with
    ``concurrency`` below the number of clients, a client drawn uniformly from the idle ones
    is dispatched. ``pull_policy="wait_new_version"`` parks a client whose model is still
    current until the next aggregation (afl-bench's rule).

    ``train_at`` says which model a client trains on. ``"dispatch"`` (default) is the papers'
    algorithm (FedStaleWeight Alg. 2, §3.1): the model version it pulled, so an update that
    arrives :math:`\tau` versions later is :math:`\tau` versions stale in its parameters.
    ``"arrival"`` reproduces the runtime behind FedStaleWeight's Fig. 2 (afl-bench, whose clients
    hold references to the live server weights): the client trains, at its arrival time, on
    the model current then, so its parameter staleness is 0, while the staleness
    :math:`\tau = n - n'` that the discount and FedStaleWeight's tracker see (§3.1) still counts
    the versions since its dispatch, a pure speed signal. Event times, data orders and
    staleness are the same in both modes.

    Args:
        buffer_size: :math:`b`, arrivals per aggregation.
        concurrency: clients in flight (default: all clients).
        delays: compute-speed model (default U(1, 2) for everyone).
        server_lr: :math:`\eta_g`.
        staleness_discount: ``"constant"``, ``"inverse"`` or ``"inverse_sqrt"``.
        max_staleness: drop (weight 0) updates staler than this.
        pull_policy: ``"immediate"`` or ``"wait_new_version"``.
        train_at: ``"dispatch"`` (train on the pulled model) or ``"arrival"`` (on the model
            current at arrival; parameter staleness 0).
    """

    def __init__(
        self,
        *,
        buffer_size: int = 5,
        concurrency: int | None = None,
        delays: DelayModel | None = None,
        server_lr: float = 1.0,
        staleness_discount: Discount = "constant",
        max_staleness: int | None = None,
        pull_policy: PullPolicy = "immediate",
        train_at: TrainAt = "dispatch",
    ) -> None:
        super().__init__(
            buffer_size=buffer_size, concurrency=concurrency, delays=delays, pull_policy=pull_policy, train_at=train_at
        )
        positive("server_lr", server_lr)
        if staleness_discount not in _DISCOUNTS:
            raise ValueError(f"`staleness_discount` must be one of {sorted(_DISCOUNTS)}, got {staleness_discount!r}.")
        optional(check_integer, "max_staleness", max_staleness, minimum=0)
        self.server_lr, self.staleness_discount, self.max_staleness = server_lr, staleness_discount, max_staleness

    @override
    def buffer_weights(self, updates: Sequence[ClientUpdate]) -> list[float]:
        """:math:`\\alpha_j` for the buffer's updates, in float64."""
        b = len(updates)
        return [
            0.0 if self.max_staleness is not None and u.staleness > self.max_staleness else _DISCOUNTS[self.staleness_discount](u.staleness) / b
            for u in updates
        ]

    def aggregate(self, round_idx: int, global_state: State, updates: list[ClientUpdate]) -> dict[str, float]:
        weights = self.buffer_weights(updates)
        self.record_influence(updates, weights)
        if any(weights):
            apply_delta(global_state, weighted_sum([u.payload for u in updates], weights), scale=self.server_lr)
        return self._buffer_metrics(updates, weights)

    @property
    def combinable(self) -> bool:
        """Yes: a buffer's updates form a group (:class:`~fl_lightning.algorithms.shared.combinable.SupportsCombine`)."""
        return True

    def combine_group(self) -> tuple[str, int]:
        """:math:`b`, the buffer."""
        return "buffer_size", self.buffer_size

    def aggregate_with(self, round_idx: int, global_state: State, updates: list[ClientUpdate], combine: Combine) -> dict[str, float]:
        r"""The step :math:`\eta_g \sum_j \alpha_j \Delta_j` written as :math:`\eta_g (\sum_j \alpha_j)\,\bar\Delta`,
        with ``combine`` of the buffer's updates of weight :math:`\alpha_j > 0` (each counting once) in place of
        their :math:`\alpha`-weighted mean :math:`\bar\Delta`: staleness discounts still shorten the step, and
        the rule sees every kept update (with the constant discount, :math:`\sum_j \alpha_j = 1`)."""
        weights = self.buffer_weights(updates)
        self.record_influence(updates, weights)
        kept = [u.payload for u, w in zip(updates, weights) if w > 0]
        if kept:
            apply_delta(global_state, combine(kept), scale=self.server_lr * sum(weights))
        return self._buffer_metrics(updates, weights)

    @staticmethod
    def _buffer_metrics(updates: list[ClientUpdate], weights: list[float]) -> dict[str, float]:
        staleness = [u.staleness for u in updates]
        return {
            "mean_staleness": float(np.mean(staleness)),
            "max_staleness": float(max(staleness)),
            "max_weight": float(max(weights)),
        }
