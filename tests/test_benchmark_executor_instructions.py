"""``benchmarks/executor_instructions.py`` reads callgrind's dumps by the names of its client requests and takes a
round's instructions as the difference of two runs, so that a fit's set-up cancels out."""

from __future__ import annotations

from pathlib import Path

import pytest

from .benchmark_scripts import import_benchmark



@pytest.fixture
def instructions(monkeypatch: pytest.MonkeyPatch):
    return import_benchmark(monkeypatch, "executor_instructions")


def dump(trigger: str, total: int) -> str:
    """The head of a callgrind dump as valgrind 3.19 writes it."""
    return f"version: 1\ncreator: callgrind-3.19.0\ndesc: Trigger: {trigger}\n\nevents: Ir\nsummary: 0\n\n\ntotals: {total}\n"


def test_dumps_are_named_by_their_request_and_the_termination_dump_is_left_out(instructions, tmp_path: Path) -> None:
    runs = {"plain-5": 5 * 100 + 40, "plain-15": 15 * 100 + 40, "auto-5": 5 * 108 + 900, "auto-15": 15 * 108 + 900}
    paths = []
    for i, (name, total) in enumerate(runs.items(), 1):
        paths.append(tmp_path / f"callgrind.7.{i}")
        paths[-1].write_text(dump(f"Client Request: {name}", total))
    paths.append(tmp_path / "callgrind.7")
    paths[-1].write_text(dump("Program termination", 0))
    totals = instructions.dump_totals(paths)
    assert totals == runs
    assert instructions.per_round(totals, 5, 15) == {"plain": 100.0, "auto": 108.0}  # the set-ups (40, 900) cancel
