r"""Trace-driven participation (Ruan et al. 2021, Section 5.1 and Table 2).

The paper records, per round, the percentage of the requested local epochs that a Raspberry
Pi submits before a fixed deadline: traces 1-5 under a competing CPU load of 0, 30, 50, 70
and 90 %, which never contain 0 %; traces 6-8 under low, medium and high bandwidth (in an
unknown order), where a device can be inactive. Each simulated device is assigned one trace
at random and draws its percentage for every round from it; ":math:`|\mathcal{T}| = j`" uses
the first :math:`j` traces.

**The raw traces and their means are not public** (only Table 2's standard deviations
survive), so :data:`PAPER_TRACE_SUBSTITUTE` is OUR SUBSTITUTE, not the paper's data: eight
empirical traces of 1000 percentages each, drawn once from a fixed seed (independent of the
run's seed) so that every trace has exactly the mean below and exactly Table 2's standard
deviation (population std, over the whole trace):

===== ========= ======== ============= =====================================================
Trace Mean (%)  Std (%)  Inactive (0%) Shape
===== ========= ======== ============= =====================================================
1     100       0        0 %           constant 100 % (0 % load: always complete)
2     80        14.8     0 %           normal clipped to [1, 100] (30 % load)
3     70        11.3     0 %           normal clipped to [1, 100] (50 % load)
4     60        11.7     0 %           normal clipped to [1, 100] (70 % load)
5     50        14.8     0 %           normal clipped to [1, 100] (90 % load)
6     45        23.3     10 %          point mass at 0 + normal clipped to [1, 100]
7     35        22.3     20 %          point mass at 0 + normal clipped to [1, 100]
8     25        18.3     30 %          point mass at 0 + normal clipped to [1, 100]
===== ========= ======== ============= =====================================================

Means decrease with the competitor load (traces 1-5) and with the inactivity mass (traces
6-8, which also rarely complete a round, as the paper observes for Scheme A). Active draws
are clipped below at 1 %, so 0 % arises only from the point mass and traces 1-5 stay free
of inactivity, as in the paper. The normal's location and scale are solved for (a short
fixed-point iteration) so that the *clipped* trace hits the target moments.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction
from typing import Literal

import numpy as np
import torch
from typing_extensions import override

from fl_lightning.participation._participation_checks import check_int, check_requested
from fl_lightning.participation.participation_model import ParticipationModel
from fl_lightning.utils.seeding import make_generator

Rounding = Literal["round", "floor", "ceil"]
_ROUNDINGS = ("round", "floor", "ceil")

# (mean %, Table 2 std %, fraction of 0 % draws) of each substitute trace; see the module docstring.
_SUBSTITUTE_SPECS = (
    (100.0, 0.0, 0.0),
    (80.0, 14.8, 0.0),
    (70.0, 11.3, 0.0),
    (60.0, 11.7, 0.0),
    (50.0, 14.8, 0.0),
    (45.0, 23.3, 0.1),
    (35.0, 22.3, 0.2),
    (25.0, 18.3, 0.3),
)
_SUBSTITUTE_LENGTH = 1000
_SUBSTITUTE_SEED = 4  # fixed: the substitute traces are data, not part of a run's randomness
_MIN_ACTIVE_PERCENT = 1.0


def _substitute_trace(index: int, mean: float, std: float, inactive: float) -> tuple[float, ...]:
    """One substitute trace with exactly the given mean, population std and fraction of zeros."""
    num_inactive = round(inactive * _SUBSTITUTE_LENGTH)
    num_active = _SUBSTITUTE_LENGTH - num_inactive
    if std == 0.0:
        return (mean,) * _SUBSTITUTE_LENGTH
    # Moments the active part needs for the whole trace (zeros included) to hit (mean, std).
    active_mean = mean / (1.0 - inactive)
    active_std = math.sqrt((std**2 - inactive * (1.0 - inactive) * active_mean**2) / (1.0 - inactive))
    z = torch.randn(num_active, generator=make_generator(_SUBSTITUTE_SEED, "paper-trace", index), dtype=torch.float64)
    z = (z - z.mean()) / z.std(correction=0)
    loc, scale = active_mean, active_std
    for _ in range(1000):
        active = (loc + scale * z).clamp(_MIN_ACTIVE_PERCENT, 100.0)
        got_mean, got_std = active.mean().item(), active.std(correction=0).item()
        if abs(got_mean - active_mean) < 1e-9 and abs(got_std - active_std) < 1e-9:
            return (0.0,) * num_inactive + tuple(active.tolist())
        # Clipping pulls the mean towards the middle and shrinks the spread: push back.
        loc += active_mean - got_mean
        scale *= active_std / got_std
    raise RuntimeError(f"Substitute trace {index + 1} did not converge to mean={mean}, std={std}.")


#: OUR SUBSTITUTE for the paper's eight participation traces (Table 2): 8 tuples of 1000
#: completion percentages in [0, 100]; see the module docstring for how they are built.
PAPER_TRACE_SUBSTITUTE: tuple[tuple[float, ...], ...] = tuple(
    _substitute_trace(index, *spec) for index, spec in enumerate(_SUBSTITUTE_SPECS)
)


def percentage_to_steps(percentage: float, requested: int, rounding: Rounding = "round") -> int:
    r"""The number of completed steps for a completion percentage: :math:`s = r(p E / 100)`.

    ``rounding`` :math:`r` is ``"round"`` (half up, :math:`\lfloor x + 1/2 \rfloor`, not
    Python's half-to-even ``round``, which would map 2.5 to 2 but 3.5 to 4), ``"floor"``
    (steps fully done by the deadline) or ``"ceil"`` (any started step counts; a non-zero
    percentage is never inactive). The product is computed exactly on the percentage's
    shortest decimal form, so 30 % of :math:`E = 10` is exactly 3 (``0.3 * 10`` is
    ``3.0000000000000004`` in floating point) and ``ceil`` does not round it up to 4.

    With small :math:`E`, ``"round"`` and ``"floor"`` turn low non-zero percentages into
    :math:`s = 0`, i.e. inactivity the trace itself does not contain.

    >>> [percentage_to_steps(50, 5, r) for r in ("round", "floor", "ceil")]
    [3, 2, 3]
    >>> percentage_to_steps(30, 10, "ceil")
    3
    """
    requested = check_requested(requested)
    _check_rounding(rounding)
    x = Fraction(repr(float(percentage))) * requested / 100
    steps = {"round": math.floor(x + Fraction(1, 2)), "floor": math.floor(x), "ceil": math.ceil(x)}[rounding]
    return min(max(steps, 0), requested)


class TraceParticipation(ParticipationModel):
    r"""Trace-driven participation (Ruan et al. 2021, Section 5.1).

    At :meth:`setup`, client :math:`k` is assigned one of the first ``num_traces`` traces
    uniformly at random (stream ``(seed, "trace", k)``). In round :math:`\tau` it draws one
    percentage :math:`p` uniformly from its trace (stream ``(seed, "participation", \tau, k)``)
    and completes :math:`s_\tau^k = r(p E / 100)` steps, see :func:`percentage_to_steps`.

    Args:
        traces: Completion percentages in :math:`[0, 100]`, one non-empty sequence per trace.
            ``None`` uses :data:`PAPER_TRACE_SUBSTITUTE`, our substitute for Table 2.
        num_traces: Use only the first ``num_traces`` traces (the paper's
            :math:`|\mathcal{T}|`); ``None`` uses all of them.
        rounding: ``"round"`` (half up), ``"floor"`` or ``"ceil"``; see :func:`percentage_to_steps`.

    >>> model = TraceParticipation(num_traces=1)  # the paper's |T| = 1: always complete
    >>> model.setup(num_clients=3, seed=0)
    >>> [model.completed_steps(k, round_idx=0, requested=5) for k in range(3)]
    [5, 5, 5]
    """

    def __init__(
        self,
        traces: Sequence[Sequence[float]] | None = None,
        *,
        num_traces: int | None = None,
        rounding: Rounding = "round",
    ) -> None:
        self.traces = PAPER_TRACE_SUBSTITUTE if traces is None else _check_traces(traces)
        if num_traces is None:
            num_traces = len(self.traces)
        elif isinstance(num_traces, bool) or not isinstance(num_traces, (int, np.integer)) or not (
            1 <= num_traces <= len(self.traces)
        ):
            raise ValueError(f"`num_traces` must be an int in [1, {len(self.traces)}], got {num_traces!r}.")
        _check_rounding(rounding)
        self.num_traces = int(num_traces)
        self.rounding: Rounding = rounding
        self._assignment: tuple[int, ...] = ()

    @override
    def _setup(self, num_clients: int) -> None:
        self._assignment = tuple(
            int(torch.randint(self.num_traces, (), generator=self._generator("trace", client)))
            for client in range(num_clients)
        )

    def assigned_trace(self, client: int) -> int:
        """The 0-based index into ``traces`` of ``client``'s trace (the paper's trace ``index + 1``)."""
        return self._assignment[self._check_client(client)]

    def percentage(self, client: int, round_idx: int) -> float:
        """The completion percentage ``client`` draws from its trace in round ``round_idx``."""
        trace = self.traces[self.assigned_trace(client)]
        round_idx = check_int("round_idx", round_idx, minimum=0)
        index = int(torch.randint(len(trace), (), generator=self._generator("participation", round_idx, client)))
        return trace[index]

    @override
    def _completed_steps(self, client: int, round_idx: int, requested: int) -> int:
        return percentage_to_steps(self.percentage(client, round_idx), requested, self.rounding)

    @override
    def __repr__(self) -> str:
        traces = "PAPER_TRACE_SUBSTITUTE" if self.traces is PAPER_TRACE_SUBSTITUTE else f"<{len(self.traces)} traces>"
        return f"TraceParticipation(traces={traces}, num_traces={self.num_traces}, rounding={self.rounding!r})"


def _check_rounding(rounding: object) -> None:
    if rounding not in _ROUNDINGS:
        raise ValueError(f"`rounding` must be one of {list(_ROUNDINGS)}, got {rounding!r}.")


def _check_traces(traces: Sequence[Sequence[float]]) -> tuple[tuple[float, ...], ...]:
    if isinstance(traces, (str, bytes)) or len(traces) == 0:
        raise ValueError(f"`traces` must be a non-empty sequence of traces, got {traces!r}.")
    checked = []
    for index, trace in enumerate(traces):
        values = np.asarray(trace, dtype=np.float64)
        if values.ndim != 1 or values.size == 0:
            raise ValueError(f"Trace {index} must be a non-empty 1-D sequence of percentages, got {trace!r}.")
        bad = np.flatnonzero(~((values >= 0.0) & (values <= 100.0)))  # also catches NaN
        if bad.size:
            raise ValueError(
                f"Trace {index} has percentage {float(values[bad[0]])!r} at position {bad[0]}; "
                "percentages must be in [0, 100]."
            )
        checked.append(tuple(values.tolist()))
    return tuple(checked)
