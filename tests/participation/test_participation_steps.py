"""FullParticipation, FixedSteps, BinomialSteps and the Inactivity wrapper."""

from __future__ import annotations

import math

import pytest

from fl_lightning.participation import BinomialSteps, FixedSteps, FullParticipation, Inactivity, ParticipationModel


def _draws(
    model: ParticipationModel, *, num_clients: int, rounds: int, requested: int, seed: int = 0
) -> list[list[int]]:
    """``draws[k][r]``: client k's steps in round r."""
    model.setup(num_clients=num_clients, seed=seed)
    return [[model.completed_steps(k, r, requested) for r in range(rounds)] for k in range(num_clients)]


def test_full_participation_always_completes_every_step() -> None:
    for requested in (1, 5, 40):
        assert _draws(FullParticipation(), num_clients=3, rounds=4, requested=requested) == [[requested] * 4] * 3


def test_fixed_steps_per_client_and_scalar() -> None:
    assert _draws(FixedSteps([3, 0, 5]), num_clients=3, rounds=2, requested=5) == [[3, 3], [0, 0], [5, 5]]
    assert _draws(FixedSteps(2), num_clients=2, rounds=2, requested=4) == [[2, 2], [2, 2]]


def test_fixed_steps_above_requested_names_client_and_values() -> None:
    model = FixedSteps([1, 7])
    model.setup(num_clients=2, seed=0)
    assert model.completed_steps(0, 0, 5) == 1
    with pytest.raises(ValueError, match=r"client 1 has steps=7 > requested E=5 \(steps=\[1, 7\]\)"):
        model.completed_steps(1, 0, 5)


@pytest.mark.parametrize(("steps", "message"), [
    ([1, -1], r"`steps\[1\]` must be an int >= 0, got -1"),
    (-2, r"`steps` must be an int >= 0, got -2"),
    ([1.5], r"`steps\[0\]` must be an int >= 0, got 1.5"),
    ([], r"non-empty per-client sequence, got \[\]"),
])  # fmt: skip
def test_fixed_steps_rejects_bad_counts(steps: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        FixedSteps(steps)  # type: ignore[arg-type]


def test_binomial_mean_and_variance_match_e_q() -> None:
    requested, q = 10, 0.3
    draws = [s for row in _draws(BinomialSteps(q), num_clients=6, rounds=500, requested=requested) for s in row]
    n = len(draws)
    mean = sum(draws) / n
    variance = sum((s - mean) ** 2 for s in draws) / (n - 1)
    assert abs(mean - requested * q) < 4 * math.sqrt(requested * q * (1 - q) / n)
    assert variance == pytest.approx(requested * q * (1 - q), rel=0.15)
    # P(s = 0) = (1 - q)^E: the paper's inactivity arises from the per-step view too.
    assert draws.count(0) / n == pytest.approx((1 - q) ** requested, abs=4 * math.sqrt(0.03 / n))


def test_binomial_per_client_probabilities_are_heterogeneous() -> None:
    draws = _draws(BinomialSteps([0.0, 1.0, 0.2, 0.8]), num_clients=4, rounds=400, requested=5)
    assert set(draws[0]) == {0} and set(draws[1]) == {5}
    for row, q in zip(draws[2:], (0.2, 0.8)):
        assert abs(sum(row) / len(row) - 5 * q) < 4 * math.sqrt(5 * q * (1 - q) / len(row))


def test_inactivity_rate_matches_probability() -> None:
    q = 0.25
    rows = _draws(Inactivity(FullParticipation(), q), num_clients=10, rounds=1000, requested=4)
    draws = [s for row in rows for s in row]
    assert set(draws) == {0, 4}
    assert abs(draws.count(0) / len(draws) - q) < 4 * math.sqrt(q * (1 - q) / len(draws))
    per_client = _draws(Inactivity(FullParticipation(), [0.0, 1.0]), num_clients=2, rounds=50, requested=3)
    assert per_client == [[3] * 50, [0] * 50]


def test_inactivity_stream_is_independent_of_the_base() -> None:
    kwargs = {"num_clients": 5, "rounds": 200, "requested": 6, "seed": 11}
    base = _draws(BinomialSteps(0.5), **kwargs)
    wrapped = _draws(Inactivity(BinomialSteps(0.5), 0.4), **kwargs)
    full_wrapped = _draws(Inactivity(FullParticipation(), 0.4), **kwargs)
    inactive = [[s == 0 for s in row] for row in full_wrapped]
    for k in range(5):
        for r in range(200):
            # Same rounds inactive whatever the base; an active client does exactly the base's steps.
            assert wrapped[k][r] == (0 if inactive[k][r] else base[k][r])


@pytest.mark.parametrize(
    "make", [BinomialSteps, lambda q: Inactivity(FullParticipation(), q)], ids=["binomial", "inactivity"]
)
@pytest.mark.parametrize(("probability", "message"), [
    (1.5, r"`probability` must be in \[0, 1\], got 1.5\."),
    (-0.1, r"`probability` must be in \[0, 1\], got -0.1\."),
    (float("nan"), r"`probability` must be in \[0, 1\], got nan\."),
    ([0.5, 2.0], r"`probability` must be in \[0, 1\], got 2.0 for client 1"),
    ([0.5, True], r"`probability` must be in \[0, 1\], got True for client 1"),
    ([], r"`probability` must be a probability or a non-empty per-client sequence, got \[\]"),
    ("0.5", r"`probability` must be a probability or a non-empty per-client sequence, got '0.5'"),
])  # fmt: skip
def test_probabilities_outside_unit_interval_are_rejected(make: object, probability: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make(probability)  # type: ignore[operator]


def test_inactivity_needs_a_participation_model() -> None:
    with pytest.raises(TypeError, match=r"`base` must be a ParticipationModel, got float"):
        Inactivity(0.5, 0.1)  # type: ignore[arg-type]
