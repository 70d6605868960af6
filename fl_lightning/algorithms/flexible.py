"""Flexible device participation (Ruan et al., "Towards Flexible Device Participation in
Federated Learning", AISTATS 2021): incomplete and inactive devices, arrivals and departures,
and the debiased aggregation scheme C."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, Literal

import numpy as np
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from typing_extensions import override

from fl_lightning.evaluation.protocols import has_client_holdout
from fl_lightning.algorithms.shared.aggregation import apply_delta, buffers_as_mean, weighted_sum
from fl_lightning.algorithms.shared.algorithm import Algorithm, ClientContext, ClientUpdate
from fl_lightning.server.federation import Federation
from fl_lightning.server.model_state import State
from fl_lightning.participation.participation_model import ParticipationModel
from fl_lightning.participation.events import Arrival, Departure, ObjectiveSchedule
from fl_lightning.participation.steps import FullParticipation
from fl_lightning.utils.checks import non_negative

Scheme = Literal["A", "B", "C"]


def scheme_coefficients(
    scheme: Scheme, steps: Sequence[int], weights: Sequence[float], requested: int, num_devices: int
) -> list[float]:
    r"""Aggregation coefficients :math:`p^k_\tau` of the paper's three schemes (§4.1).

    - A (drop incomplete): :math:`N p^k \mathbb{1}[s_k = E] / K_\tau`, all 0 when :math:`K_\tau = 0`;
    - B (accept partial work): :math:`p^k`;
    - C (debiased): :math:`(E / s_k)\, p^k`, 0 when :math:`s_k = 0`.

    They multiply deltas without renormalisation (eq. 2): :math:`w \leftarrow w + \sum_k p^k_\tau \Delta_k`.

    >>> scheme_coefficients("C", [3, 4, 5, 5], [0.25] * 4, requested=5, num_devices=4)
    [0.4166666666666667, 0.3125, 0.25, 0.25]
    >>> scheme_coefficients("A", [3, 4, 5, 5], [0.25] * 4, requested=5, num_devices=4)
    [0.0, 0.0, 0.5, 0.5]
    """
    if requested < 1:
        raise ValueError(f"The requested local steps E must be >= 1, got {requested}.")
    if any(not 0 <= s <= requested for s in steps):
        raise ValueError(f"Completed steps must be in 0..{requested}, got {list(steps)}.")
    if scheme == "A":
        complete = sum(s == requested for s in steps)
        return [num_devices * p / complete if s == requested else 0.0 for s, p in zip(steps, weights)]
    if scheme == "B":
        return [float(p) for p in weights]
    if scheme == "C":
        return [requested / s * p if s > 0 else 0.0 for s, p in zip(steps, weights)]
    raise ValueError(f"`scheme` must be 'A', 'B' or 'C', got {scheme!r}.")


class FlexibleParticipation(Algorithm):
    r"""FedAvg with flexible device participation (Ruan et al. 2021).

    Every round, each device present in the objective :math:`C_\tau` is asked for
    :math:`E` = ``local_steps`` SGD steps and completes :math:`s_k \in \{0..E\}` of them, as drawn
    by the ``participation`` model (:math:`s_k = 0`: inactive, no forward pass). The server
    updates :math:`w \leftarrow w + \sum_k p^k_\tau \Delta_k` (eq. 2, no renormalisation) with the
    coefficients of :func:`scheme_coefficients`, where :math:`p^k = n_k / \sum_{j \in C_\tau} n_j`.

    Objective shifts: an :class:`~fl_lightning.participation.Arrival` adds the device to
    :math:`C_\tau` (weights recomputed) and restarts any
    :class:`~fl_lightning.models.schedulers.StaircaseLR` (:math:`\eta_0/(\tau-\tau_0)`); with
    ``fast_reboot`` its weight is :math:`p^l (1 + b/(\tau - \tau_0 + 1)^2)`, i.e. :math:`3p^l` in its first
    round for :math:`b = 2`, decaying to :math:`p^l` (the paper states 3p decaying as O(τ⁻²) without
    the formula; ours is the notes' suggestion). A :class:`~fl_lightning.participation.Departure`
    with ``"exclude"`` removes the device (weights recomputed, learning rate restarted); with
    ``"include"`` it stays in the objective but never trains again. When the data module has
    per-client held-out data and events are given, the server evaluates on the held-out samples
    of :math:`C_\tau`, so the evaluation set follows the objective as in the paper.

    Choices where the paper is silent: a scheme-A round with no complete device leaves the
    model unchanged but still counts as a round; all present devices train each round
    (a ``clients_per_round`` below all is overridden, with a warning); :math:`N` in scheme A is :math:`|C_\tau|`.

    ``debias_inactivity`` (an extension, not in the paper, notes §2.2): divides a device's
    coefficient by its empirical frequency of being active, which removes the residual bias of
    inactive devices.

    Args:
        scheme: ``"A"``, ``"B"`` or ``"C"`` (the paper's proposal, default).
        participation: how many steps each device completes (default: all).
        arrivals: device arrivals.
        departures: device departures.
        fast_reboot: boost an arriving device's weight.
        reboot_boost: :math:`b` above.
        debias_inactivity: the extension above.
    Buffers (BatchNorm statistics) take the normalised mean of their deltas under the same
    coefficients, not the coefficients themselves, whose sum is not 1
    (:func:`~fl_lightning.algorithms.shared.aggregation.buffers_as_mean`).
    """

    summary_metrics: ClassVar[dict[str, str]] = {"round/inactive_clients": "mean", "round/coefficient_sum": "mean"}

    def __init__(
        self,
        *,
        scheme: Scheme = "C",
        participation: ParticipationModel | None = None,
        arrivals: Sequence[Arrival] = (),
        departures: Sequence[Departure] = (),
        fast_reboot: bool = False,
        reboot_boost: float = 2.0,
        debias_inactivity: bool = False,
    ) -> None:
        if scheme not in ("A", "B", "C"):
            raise ValueError(f"`scheme` must be 'A', 'B' or 'C', got {scheme!r}.")
        non_negative("reboot_boost", reboot_boost)
        self.scheme: Scheme = scheme
        self.participation = participation if participation is not None else FullParticipation()
        self.arrivals, self.departures = list(arrivals), list(departures)
        self.fast_reboot, self.reboot_boost = fast_reboot, reboot_boost
        self.debias_inactivity = debias_inactivity
        self._active_rounds = np.zeros(0, dtype=np.int64)
        self._present_rounds = np.zeros(0, dtype=np.int64)
        self._evaluated: list[int] | None = None

    def setup(self, federation: Federation) -> None:
        if federation.local_steps is None:
            raise ValueError(
                "FlexibleParticipation counts local work in SGD steps (the paper's E): set the trainer's "
                "`local_steps`, not `local_epochs`."
            )
        super().setup(federation)
        self.requested = federation.local_steps
        self.participation.setup(num_clients=federation.num_clients, seed=federation.seed)
        self.schedule = ObjectiveSchedule(
            num_clients=federation.num_clients,
            arrivals=self.arrivals,
            departures=self.departures,
            total_rounds=federation.num_rounds,
            local_steps=self.requested,
        )
        if len(self._active_rounds) != federation.num_clients:
            self._active_rounds = np.zeros(federation.num_clients, dtype=np.int64)
            self._present_rounds = np.zeros(federation.num_clients, dtype=np.int64)
        self._evaluated = None

    @override
    def unnoised_client_values(self) -> str:
        return "each client's sample count (p^k) and completed step count (its scheme coefficient)"

    @override
    def overridden_settings(self) -> dict[str, str]:
        federation = self.federation
        return self.clients_per_round_overridden(
            f"every present device trains each round (the paper's C_tau), not "
            f"clients_per_round={federation.clients_per_round} of {federation.num_clients}"
        )

    def weights(self, round_idx: int) -> dict[int, float]:
        r""":math:`p^k = n_k / \sum_{j \in C_\tau} n_j` over the objective at ``round_idx``."""
        members = self.schedule.members(round_idx)
        sizes = self.federation.num_samples[members].astype(np.float64)
        return {k: float(n / sizes.sum()) for k, n in zip(members, sizes)}

    def boost(self, client: int, round_idx: int) -> float:
        """Fast-reboot factor on an arrived device's weight (1 when off or not an arrival)."""
        arrived = self.schedule.arrival_round.get(client)
        if not self.fast_reboot or arrived is None or arrived == 0:
            return 1.0
        return 1.0 + self.reboot_boost / (round_idx - arrived + 1) ** 2

    def select_clients(self, round_idx: int) -> list[int]:
        if round_idx > 0 and self.schedule.shift_round(round_idx) == round_idx:
            self.federation.services.restart_lr_schedules(round_idx)
        self._follow_objective(self.schedule.members(round_idx))
        return self.schedule.present(round_idx)

    def _follow_objective(self, members: list[int]) -> None:
        if not (self.arrivals or self.departures) or members == self._evaluated:
            return
        data = self.federation.data
        if has_client_holdout(data) and hasattr(data, "set_evaluation_clients"):
            data.set_evaluation_clients(members)
            self.federation.services.reload_evaluation_data()
        elif self._evaluated is None:
            rank_zero_warn(
                "The objective changes over rounds but the data has no per-client held-out split "
                "(holdout_fraction=0): the server keeps validating on its whole validation set."
            )
        self._evaluated = members

    def plan_client(self, client: ClientContext) -> None:
        client.num_epochs = None
        client.num_steps = self.participation.completed_steps(client.client_id, client.round_idx, self.requested)

    def aggregate(self, round_idx: int, global_state: State, updates: list[ClientUpdate]) -> dict[str, float]:
        weights = self.weights(round_idx)
        steps = [u.num_steps for u in updates]
        for u in updates:
            self._present_rounds[u.client_id] += 1
            self._active_rounds[u.client_id] += u.num_steps > 0
        boosted = [weights[u.client_id] * self.boost(u.client_id, round_idx) for u in updates]
        coefficients = scheme_coefficients(self.scheme, steps, boosted, self.requested, len(weights))
        if self.debias_inactivity:
            # An inactive device sends a zero delta: its coefficient is 0 (scheme B would
            # otherwise divide by an active count of 0 and turn that zero delta into NaN).
            coefficients = [
                c * self._present_rounds[u.client_id] / self._active_rounds[u.client_id] if c and u.num_steps else 0.0
                for c, u in zip(coefficients, updates)
            ]
        metrics = {
            "coefficient_sum": float(sum(coefficients)),
            "complete_clients": float(sum(s == self.requested for s in steps)),
            "inactive_clients": float(sum(s == 0 for s in steps)),
            "objective_clients": float(len(weights)),
        }
        if any(coefficients):
            payloads = [u.payload for u in updates]
            # Buffers: the coefficients' normalised mean (their sum is not 1; issue 39, aggregation's buffer rule).
            total = buffers_as_mean(weighted_sum(payloads, coefficients), payloads, coefficients, self.federation.param_names)
            apply_delta(global_state, total)
        metrics["discarded"] = float(not any(coefficients))
        return metrics

    def state_dict(self) -> dict[str, Any]:
        return {
            "participation": self.participation.state_dict(),
            "active_rounds": self._active_rounds.tolist(),
            "present_rounds": self._present_rounds.tolist(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.participation.load_state_dict(state["participation"])
        self._active_rounds = np.asarray(state["active_rounds"], dtype=np.int64)
        self._present_rounds = np.asarray(state["present_rounds"], dtype=np.int64)
