"""``benchmarks/executor_calls.py`` counts calls per round: a set-up's calls cancel out, each round's are counted."""

from __future__ import annotations

from pathlib import Path

import pytest

from .benchmark_scripts import import_benchmark



@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch):
    return import_benchmark(monkeypatch, "executor_calls").calls


def step() -> None:
    len("x")


def set_up() -> None:
    pass


def fit(rounds: int) -> None:
    for _ in range(3):  # a set-up of three calls, whatever the rounds
        set_up()
    for _ in range(rounds):
        step()
        step()


def test_calls_per_round_leave_the_set_up_out(calls) -> None:
    counted = calls(fit, rounds=4)
    here = {name.rsplit(":", 1)[1]: count for name, count in counted.items() if Path(__file__).name in name}
    assert here == {"step": 2.0}  # the set-up and the fit call itself cancel out
    assert counted["C:len"] == 2
