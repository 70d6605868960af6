"""TraceParticipation, the rounding of percentages to steps, and the paper-trace substitute."""

from __future__ import annotations

import math
import statistics
from collections import Counter

import pytest

from fl_lightning.participation import PAPER_TRACE_SUBSTITUTE, TraceParticipation, percentage_to_steps
from fl_lightning.participation.traces import _SUBSTITUTE_SPECS, _substitute_trace

TABLE_2_STDEVS = (0.0, 14.8, 11.3, 11.7, 14.8, 23.3, 22.3, 18.3)
# Our documented substitute (the paper's means are not public).
SUBSTITUTE_MEANS = (100.0, 80.0, 70.0, 60.0, 50.0, 45.0, 35.0, 25.0)
SUBSTITUTE_INACTIVE = (0.0, 0.0, 0.0, 0.0, 0.0, 0.1, 0.2, 0.3)


@pytest.mark.parametrize(("percentage", "requested", "expected"), [
    # (round half up, floor, ceil)
    (50, 5, (3, 2, 3)),
    (90, 5, (5, 4, 5)),  # 4.5: half up, where half-to-even would give 4
    (70, 5, (4, 3, 4)),
    (10, 5, (1, 0, 1)),
    (49.9, 1, (0, 0, 1)),
    (20, 5, (1, 1, 1)),
    (30, 10, (3, 3, 3)),  # 0.3 * 10 = 3.0000000000000004 in floats; must not ceil to 4
    (14.8, 1000, (148, 148, 148)),
    (0, 7, (0, 0, 0)),
    (100, 7, (7, 7, 7)),
])  # fmt: skip
def test_rounding_modes_on_hand_picked_values(percentage: float, requested: int, expected: tuple[int, ...]) -> None:
    modes = ("round", "floor", "ceil")
    assert tuple(percentage_to_steps(percentage, requested, r) for r in modes) == expected  # type: ignore[arg-type]
    for rounding, steps in zip(modes, expected):
        model = TraceParticipation([[percentage]], rounding=rounding)  # type: ignore[arg-type]
        model.setup(num_clients=2, seed=0)
        assert model.completed_steps(1, 3, requested) == steps


def test_assignment_is_roughly_uniform_over_the_first_num_traces() -> None:
    model = TraceParticipation([[10], [20], [30], [40], [50]], num_traces=4)
    n = 4000
    model.setup(num_clients=n, seed=0)
    counts = Counter(model.assigned_trace(k) for k in range(n))
    assert set(counts) == {0, 1, 2, 3}
    assert all(abs(c - n / 4) < 4 * math.sqrt(n * 0.25 * 0.75) for c in counts.values())


def test_each_round_draws_uniformly_from_the_clients_own_trace() -> None:
    traces = [[10, 20], [30, 40], [50, 60]]
    model = TraceParticipation(traces)
    model.setup(num_clients=30, seed=5)
    rounds = 200
    for k in range(30):
        trace = traces[model.assigned_trace(k)]
        steps = [model.completed_steps(k, r, 10) for r in range(rounds)]
        assert {10 * s for s in steps} <= set(trace)
        assert model.percentage(k, 7) in trace
        low_share = sum(10 * s == trace[0] for s in steps) / rounds
        assert abs(low_share - 0.5) < 4 * math.sqrt(0.25 / rounds)


def test_assignment_depends_on_the_seed() -> None:
    def assignment(seed: int) -> list[int]:
        model = TraceParticipation()
        model.setup(num_clients=20, seed=seed)
        return [model.assigned_trace(k) for k in range(20)]

    assert assignment(0) == assignment(0) != assignment(1)


@pytest.mark.parametrize("rounding", ["round", "floor", "ceil"])
def test_trace_one_always_completes_every_step(rounding: str) -> None:
    model = TraceParticipation(num_traces=1, rounding=rounding)  # type: ignore[arg-type]
    model.setup(num_clients=5, seed=2)
    for requested in (1, 3, 7, 100):
        assert {model.completed_steps(k, r, requested) for k in range(5) for r in range(20)} == {requested}


def test_paper_traces_one_to_five_are_never_inactive_with_ceil() -> None:
    model = TraceParticipation(num_traces=5, rounding="ceil")
    model.setup(num_clients=40, seed=0)
    assert {model.assigned_trace(k) for k in range(40)} == set(range(5))
    assert min(model.completed_steps(k, r, 2) for k in range(40) for r in range(50)) >= 1


def test_substitute_traces_have_the_documented_moments() -> None:
    assert len(PAPER_TRACE_SUBSTITUTE) == 8
    specs = zip(PAPER_TRACE_SUBSTITUTE, SUBSTITUTE_MEANS, TABLE_2_STDEVS, SUBSTITUTE_INACTIVE)
    for trace, mean, std, inactive in specs:
        assert len(trace) == 1000 and all(0.0 <= p <= 100.0 for p in trace)
        assert statistics.fmean(trace) == pytest.approx(mean, abs=1e-6)
        assert statistics.pstdev(trace) == pytest.approx(std, abs=1e-6)
        assert trace.count(0.0) / len(trace) == inactive
    assert set(PAPER_TRACE_SUBSTITUTE[0]) == {100.0}


def test_substitute_traces_are_rebuilt_identically() -> None:
    assert tuple(_substitute_trace(i, *spec) for i, spec in enumerate(_SUBSTITUTE_SPECS)) == PAPER_TRACE_SUBSTITUTE


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"traces": []}, r"`traces` must be a non-empty sequence of traces, got \[\]"),
    ({"traces": [[50], []]}, r"Trace 1 must be a non-empty 1-D sequence of percentages, got \[\]"),
    ({"traces": [[50, 101]]}, r"Trace 0 has percentage 101.0 at position 1; percentages must be in \[0, 100\]"),
    ({"traces": [[-0.5]]}, r"Trace 0 has percentage -0.5 at position 0"),
    ({"traces": [[float("nan")]]}, r"Trace 0 has percentage nan at position 0"),
    ({"traces": [[50], [60]], "num_traces": 0}, r"`num_traces` must be an int in \[1, 2\], got 0"),
    ({"traces": [[50], [60]], "num_traces": 3}, r"`num_traces` must be an int in \[1, 2\], got 3"),
    ({"num_traces": 9}, r"`num_traces` must be an int in \[1, 8\], got 9"),
    ({"rounding": "nearest"}, r"`rounding` must be one of \['round', 'floor', 'ceil'\], got 'nearest'"),
])  # fmt: skip
def test_bad_traces_are_rejected(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TraceParticipation(**kwargs)  # type: ignore[arg-type]


def test_percentage_to_steps_rejects_bad_requested_and_rounding() -> None:
    with pytest.raises(ValueError, match=r"E must be >= 1, got requested=0"):
        percentage_to_steps(50, 0)
    with pytest.raises(ValueError, match=r"`rounding` must be one of"):
        percentage_to_steps(50, 5, "half-even")  # type: ignore[arg-type]


def test_repr_does_not_dump_the_traces() -> None:
    assert repr(TraceParticipation(num_traces=3)) == (
        "TraceParticipation(traces=PAPER_TRACE_SUBSTITUTE, num_traces=3, rounding='round')"
    )
    assert repr(TraceParticipation([[1], [2]], rounding="ceil")) == (
        "TraceParticipation(traces=<2 traces>, num_traces=2, rounding='ceil')"
    )
