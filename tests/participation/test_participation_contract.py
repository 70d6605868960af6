"""The ParticipationModel contract, checked on every implementation by one shared harness."""

from __future__ import annotations

import copy
import doctest
import pickle
import random
from collections.abc import Callable

import pytest

import fl_lightning.participation as participation
from fl_lightning.participation import (
    BinomialSteps,
    FixedSteps,
    FullParticipation,
    Inactivity,
    ParticipationModel,
    TraceParticipation,
)
from fl_lightning.participation import inactivity, steps, traces
from fl_lightning.participation import participation_model as base

NUM_CLIENTS = 6
E = 8
ROUNDS = 12

DETERMINISTIC: dict[str, Callable[[], ParticipationModel]] = {
    "full": FullParticipation,
    "fixed": lambda: FixedSteps([0, 1, 2, 3, 5, 8]),
}
STOCHASTIC: dict[str, Callable[[], ParticipationModel]] = {
    "binomial": lambda: BinomialSteps(0.5),
    "binomial-per-client": lambda: BinomialSteps([0.1, 0.3, 0.5, 0.7, 0.9, 0.6]),
    "inactivity": lambda: Inactivity(BinomialSteps(0.6), probability=0.3),
    "trace-paper": TraceParticipation,
    "trace-floor": lambda: TraceParticipation(num_traces=6, rounding="floor"),
    "trace-ceil": lambda: TraceParticipation([[10, 35, 50], [64, 80, 100], [0, 12.5]], rounding="ceil"),
}
ALL = {**DETERMINISTIC, **STOCHASTIC}


def _ready(factory: Callable[[], ParticipationModel], seed: int = 0) -> ParticipationModel:
    model = factory()
    model.setup(num_clients=NUM_CLIENTS, seed=seed)
    return model


def _grid(model: ParticipationModel, cells: list[tuple[int, int]]) -> dict[tuple[int, int], int]:
    return {(k, r): model.completed_steps(k, r, E) for k, r in cells}


CELLS = [(k, r) for r in range(ROUNDS) for k in range(NUM_CLIENTS)]


@pytest.mark.parametrize("factory", ALL.values(), ids=ALL.keys())
def test_same_seed_same_steps_whatever_the_call_order(factory: Callable[[], ParticipationModel]) -> None:
    expected = _grid(_ready(factory, seed=3), CELLS)
    shuffled = CELLS[::-1] + random.Random(0).sample(CELLS, len(CELLS))
    model = _ready(factory, seed=3)
    # Interleaved queries with another E must not shift the streams.
    for k, r in shuffled:
        model.completed_steps(k, r, E + 3)
        assert model.completed_steps(k, r, E) == expected[(k, r)]
    assert _grid(_ready(factory, seed=3), CELLS[5:9]) == {c: expected[c] for c in CELLS[5:9]}


@pytest.mark.parametrize("factory", ALL.values(), ids=ALL.keys())
def test_steps_are_ints_in_zero_to_requested(factory: Callable[[], ParticipationModel]) -> None:
    model = _ready(factory)
    for requested in (8, 9, 17):
        for k, r in CELLS:
            s = model.completed_steps(k, r, requested)
            assert type(s) is int and 0 <= s <= requested


@pytest.mark.parametrize("factory", STOCHASTIC.values(), ids=STOCHASTIC.keys())
def test_different_seed_gives_different_steps(factory: Callable[[], ParticipationModel]) -> None:
    assert _grid(_ready(factory, seed=0), CELLS) != _grid(_ready(factory, seed=1), CELLS)


@pytest.mark.parametrize("factory", ALL.values(), ids=ALL.keys())
def test_copies_and_pickles_reproduce_the_steps(factory: Callable[[], ParticipationModel]) -> None:
    model = _ready(factory, seed=7)
    expected = _grid(model, CELLS)
    assert _grid(copy.deepcopy(model), CELLS) == expected
    assert _grid(pickle.loads(pickle.dumps(model)), CELLS) == expected
    restored = _ready(factory, seed=7)
    restored.load_state_dict(model.state_dict())
    assert _grid(restored, CELLS) == expected


def test_state_dict_defaults_to_empty_and_inactivity_nests_its_base() -> None:
    assert _ready(STOCHASTIC["binomial"]).state_dict() == {}
    assert _ready(STOCHASTIC["inactivity"]).state_dict() == {"base": {}}


@pytest.mark.parametrize("requested", [0, -1, 2.0, True])
@pytest.mark.parametrize("factory", ALL.values(), ids=ALL.keys())
def test_requested_below_one_is_rejected(factory: Callable[[], ParticipationModel], requested: object) -> None:
    with pytest.raises(ValueError, match=rf"E must be >= 1, got requested={requested!r}"):
        _ready(factory).completed_steps(0, 0, requested)  # type: ignore[arg-type]


@pytest.mark.parametrize("factory", ALL.values(), ids=ALL.keys())
def test_bad_client_round_or_missing_setup_is_rejected(factory: Callable[[], ParticipationModel]) -> None:
    with pytest.raises(RuntimeError, match=r"setup\(num_clients=..., seed=...\) must be called first"):
        factory().completed_steps(0, 0, E)
    model = _ready(factory)
    with pytest.raises(ValueError, match=r"`client` must be in \[0, 6\), got 6"):
        model.completed_steps(NUM_CLIENTS, 0, E)
    with pytest.raises(ValueError, match=r"`client` must be an int >= 0, got -1"):
        model.completed_steps(-1, 0, E)
    with pytest.raises(ValueError, match=r"`round_idx` must be an int >= 0, got -1"):
        model.completed_steps(0, -1, E)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"num_clients": 0, "seed": 0}, r"`num_clients` must be an int >= 1, got 0"),
    ({"num_clients": 2, "seed": -1}, r"`seed` must be an int >= 0, got -1"),
])
def test_bad_setup_arguments_are_rejected(kwargs: dict[str, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        FullParticipation().setup(**kwargs)


@pytest.mark.parametrize(("model", "message"), [
    (BinomialSteps([0.5, 0.5]), r"BinomialSteps: got 2 per-client values of `probability` for num_clients=3"),
    (Inactivity(FullParticipation(), [0.1] * 4), r"Inactivity: got 4 per-client values of `probability` for num_"),
    (Inactivity(BinomialSteps([0.5] * 2), 0.1), r"BinomialSteps: got 2 per-client values of `probability` for num_"),
    (FixedSteps([1, 2]), r"FixedSteps: got 2 per-client values of `steps` for num_clients=3"),
])  # fmt: skip
def test_wrong_per_client_length_is_rejected_at_setup(model: ParticipationModel, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        model.setup(num_clients=3, seed=0)
    with pytest.raises(RuntimeError, match="must be called first"):
        model.completed_steps(0, 0, E)


def test_a_model_returning_steps_out_of_range_is_a_runtime_error() -> None:
    class TooMany(ParticipationModel):
        def _completed_steps(self, client: int, round_idx: int, requested: int) -> int:
            return requested + 1

    model = TooMany()
    model.setup(num_clients=1, seed=0)
    message = r"TooMany returned 6 steps for client 0 in round 2; expected an int in \[0, 5\]"
    with pytest.raises(RuntimeError, match=message):
        model.completed_steps(0, 2, 5)


def test_public_api_and_docstring_examples() -> None:
    expected = {"PAPER_TRACE_SUBSTITUTE", "BinomialSteps", "FixedSteps", "FullParticipation", "Inactivity",
                "ParticipationModel", "TraceParticipation", "percentage_to_steps"}  # fmt: skip
    assert expected <= set(participation.__all__)
    assert all(hasattr(participation, name) for name in participation.__all__)
    for module in (participation, base, inactivity, steps, traces):
        assert doctest.testmod(module, raise_on_error=True).failed == 0
