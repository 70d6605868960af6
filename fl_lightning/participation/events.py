"""Device arrivals and departures, and the objective they define (Ruan et al. 2021, §3.3, §4.2–4.3).

The objective set :math:`C_\\tau` is a pure function of the round and the event list, so it
needs no checkpointed state and is identical on resume.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from fl_lightning.utils.init_args import RecordsInitArgs
from fl_lightning.utils.checks import check_integer, non_negative, optional

DeparturePolicy = Literal["include", "exclude", "auto"]


@dataclass(frozen=True)
class Arrival:
    """Device ``client`` joins at round ``round`` (0-based; it trains from that round on)."""

    client: int
    round: int

    def __post_init__(self) -> None:
        check_integer("client", self.client, minimum=0)
        check_integer("round", self.round, minimum=0)


@dataclass(frozen=True)
class Departure:
    """Device ``client`` leaves for good at round ``round`` (it never trains from that round on).

    Args:
        policy: ``"include"`` keeps its data in the objective (it stays, permanently inactive);
            ``"exclude"`` removes it (objective shift, learning-rate restart); ``"auto"`` applies
            :func:`should_exclude`.
        noniid: :math:`\\Gamma_l`, the departing device's non-IID measure (estimate), for ``"auto"``.
        constants: :math:`(D, V, \\gamma)` of the paper's bounds for the exact rule of ``"auto"``;
            without them the :math:`\\sqrt{\\Gamma_l \\tau_0}` heuristic is used.
        heuristic_scale: :math:`c` of the heuristic ``T - tau0 >= c * sqrt(Gamma_l * tau0)``.
    """

    client: int
    round: int
    policy: DeparturePolicy = "exclude"
    noniid: float | None = None
    constants: tuple[float, float, float] | None = None
    heuristic_scale: float = 1.0

    def __post_init__(self) -> None:
        check_integer("client", self.client, minimum=0)
        check_integer("round", self.round, minimum=0)
        optional(non_negative, "noniid", self.noniid)
        for name, value in zip(("D", "V", "gamma"), self.constants or ()):
            non_negative(f"constants.{name}", value)
        non_negative("heuristic_scale", self.heuristic_scale)


def should_exclude(
    *,
    departure_round: int,
    total_rounds: int,
    local_steps: int,
    noniid: float,
    constants: tuple[float, float, float] | None = None,
    heuristic_scale: float = 1.0,
) -> bool:
    r"""Corollary 4.0.3: exclude a departed device iff :math:`\min_{\tau \ge \tau_0} f_0(\tau) \ge f_1(T)`.

    With the bounds' constants :math:`(D, V, \gamma)`:
    :math:`f_0(\tau) = ((\tau - \tau_0) D + V) / (\tau E + \gamma)` (keep the old objective) and
    :math:`f_1(T) = \tilde V / ((T - \tau_0) E + \gamma)` with
    :math:`\tilde V = V / (\tau_0 E + \gamma) + \Gamma_l` (exclude it). :math:`f_0` is monotone, so
    its minimum is :math:`f_0(\tau_0)` when it increases and its limit :math:`D/E` otherwise.
    Without constants, the paper's consequence :math:`T - \tau_0 \ge c \sqrt{\Gamma_l \tau_0}`.
    """
    if noniid < 0:
        raise ValueError(f"The non-IID measure Gamma_l must be >= 0, got {noniid}.")
    remaining = total_rounds - departure_round
    if constants is None:
        return remaining >= heuristic_scale * math.sqrt(noniid * departure_round)
    d, v, gamma = constants
    e, t0 = local_steps, departure_round
    increasing = d * (t0 * e + gamma) >= e * v
    min_keep = v / (t0 * e + gamma) if increasing else d / e
    v_tilde = v / (t0 * e + gamma) + noniid
    return min_keep >= v_tilde / (remaining * e + gamma)


class ObjectiveSchedule(RecordsInitArgs):
    """Which devices are in the objective :math:`C_\\tau` and which can train, round by round.

    Devices with an :class:`Arrival` are outside the objective until they arrive; the others
    are in from round 0. ``"auto"`` departures are decided once, here, by :func:`should_exclude`.
    """

    def __init__(
        self,
        *,
        num_clients: int,
        arrivals: Sequence[Arrival] = (),
        departures: Sequence[Departure] = (),
        total_rounds: int | None = None,
        local_steps: int = 1,
    ) -> None:
        check_integer("num_clients", num_clients, minimum=1)
        optional(check_integer, "total_rounds", total_rounds, minimum=1)
        check_integer("local_steps", local_steps, minimum=1)
        for event in (*arrivals, *departures):
            if not 0 <= event.client < num_clients:
                raise ValueError(f"{event} names an unknown device: ids are 0..{num_clients - 1}.")
        for kind, events in (("arrival", arrivals), ("departure", departures)):
            clients = [e.client for e in events]
            if len(set(clients)) != len(clients):
                raise ValueError(f"A device has more than one {kind}: {sorted(clients)}.")
        arrival_round = {a.client: a.round for a in arrivals}
        for d in departures:
            if d.client in arrival_round and d.round <= arrival_round[d.client]:
                raise ValueError(f"{d} is not after the device's arrival at round {arrival_round[d.client]}.")
        self.num_clients = num_clients
        self.arrival_round = arrival_round
        self.departures = {d.client: d for d in departures}
        self.excluded = {d.client for d in departures if self._excludes(d, total_rounds, local_steps)}

    @staticmethod
    def _excludes(d: Departure, total_rounds: int | None, local_steps: int) -> bool:
        if d.policy != "auto":
            if d.policy not in ("include", "exclude"):
                raise ValueError(f"Departure policy must be 'include', 'exclude' or 'auto', got {d.policy!r}.")
            return d.policy == "exclude"
        if d.noniid is None or total_rounds is None:
            raise ValueError(f"{d}: the 'auto' policy needs `noniid` (Gamma_l) and a finite number of rounds.")
        return should_exclude(
            departure_round=d.round,
            total_rounds=total_rounds,
            local_steps=local_steps,
            noniid=d.noniid,
            constants=d.constants,
            heuristic_scale=d.heuristic_scale,
        )

    def members(self, round_idx: int) -> list[int]:
        """The objective set :math:`C_\\tau` at ``round_idx``."""
        return [
            k
            for k in range(self.num_clients)
            if self.arrival_round.get(k, 0) <= round_idx
            and not (k in self.excluded and self.departures[k].round <= round_idx)
        ]

    def present(self, round_idx: int) -> list[int]:
        """Members that can still train (departed devices kept under ``"include"`` cannot)."""
        return [k for k in self.members(round_idx) if not (k in self.departures and self.departures[k].round <= round_idx)]

    def shift_round(self, round_idx: int) -> int:
        """The last round ``<= round_idx`` at which the objective changed (0 if never)."""
        shifts = [r for r in self.arrival_round.values() if r <= round_idx]
        shifts += [self.departures[k].round for k in self.excluded if self.departures[k].round <= round_idx]
        return max(shifts, default=0)
