"""Tables 4-5 recovery measures against hand-computed curves."""

from __future__ import annotations

import pytest

from fl_lightning.participation import crossing_rounds, recovery_rounds


@pytest.mark.parametrize(
    ("accuracy", "tau0", "expected"),
    [
        ([0.5, 0.7, 0.4, 0.6, 0.7, 0.8], 2, 3),  # back to 0.7 (round 1) at round 4 = tau0 + 3 - 1
        ([0.5, 0.7, 0.9, 0.6], 2, 1),  # no drop: recovered after the first round
        ([0.5, 0.7, 0.7], 2, 1),  # equal counts as recovered
        ([0.5, 0.7, 0.4, 0.6, 0.69], 2, None),  # never within the curve
        ([0.2, 0.1], 1, None),
    ],
)
def test_recovery_rounds(accuracy: list[float], tau0: int, expected: int | None) -> None:
    assert recovery_rounds(accuracy, tau0) == expected


@pytest.mark.parametrize(
    ("shifted", "kept", "tau0", "expected"),
    [
        ([1.0, 0.9, 1.5, 1.0, 0.7], [1.0, 0.9, 0.85, 0.8, 0.75], 2, 3),
        ([1.0, 0.9, 0.8], [1.0, 0.9, 0.85], 2, 1),  # below from the start
        ([1.0, 2.0, 0.5], [1.0, 1.0, 0.5], 1, 2),  # equal counts as coinciding
        ([1.0, 2.0, 1.9], [1.0, 1.0, 1.0], 1, None),
        ([1.0, 2.0, 1.9, 0.1], [1.0, 1.0, 1.0], 1, None),  # only rounds both curves have
    ],
)
def test_crossing_rounds(shifted: list[float], kept: list[float], tau0: int, expected: int | None) -> None:
    assert crossing_rounds(shifted, kept, tau0) == expected


@pytest.mark.parametrize(
    ("curve", "tau0", "match"), [([0.1, 0.2], 0, r"tau0 must be >= 1 .*got 0"), ([0.1, 0.2], 2, "2 rounds has no round")]
)
def test_bad_input_is_named(curve: list[float], tau0: int, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        recovery_rounds(curve, tau0)
    with pytest.raises(ValueError, match=match):
        crossing_rounds(curve, curve, tau0)
