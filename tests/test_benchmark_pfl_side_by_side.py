"""``benchmarks/pfl_side_by_side.py`` without pfl-research: one SKIP line; with it, pfl's rounds read from the last
line its simulator prints (pfl logs its metrics above it), and a failing simulator raises with its error."""

from __future__ import annotations

import argparse
import importlib.util
import re
import sys
from pathlib import Path

import numpy as np
import pytest

from .benchmark_scripts import import_benchmark



@pytest.fixture
def side_by_side(monkeypatch: pytest.MonkeyPatch):
    return import_benchmark(monkeypatch, "pfl_side_by_side")


def fake_python(tmp_path: Path, body: str) -> str:
    """An executable standing in for pfl's Python: a shell script running ``body``, whatever its arguments."""
    path = tmp_path / "python"
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return str(path)


def test_without_pfl_python_it_prints_one_skip_line(side_by_side, capsys: pytest.CaptureFixture[str]) -> None:
    side_by_side.main([])
    assert capsys.readouterr().out == "SKIP: pfl-research side by side not run: no --pfl-python given\n"


@pytest.mark.skipif(importlib.util.find_spec("pfl") is not None, reason="this environment has pfl")
def test_a_python_without_pfl_is_named_in_the_skip_line(side_by_side, capsys: pytest.CaptureFixture[str]) -> None:
    side_by_side.main(["--pfl-python", sys.executable])
    out = capsys.readouterr().out
    assert out.startswith(f"SKIP: pfl-research side by side not run: --pfl-python {sys.executable!r} cannot import pfl")
    assert "ModuleNotFoundError" in out and out.count("\n") == 1


def test_a_missing_interpreter_is_named(side_by_side, tmp_path: Path) -> None:
    assert "cannot be started" in side_by_side.pfl_missing(str(tmp_path / "absent"))


def test_pfls_rounds_are_the_last_line_it_prints(side_by_side, tmp_path: Path) -> None:
    python = fake_python(
        tmp_path, """echo 'Train population | loss : 2.3'; echo '{"rounds": [[2.0, 1.5], [1.0, 0.5]], "pfl": "0.6.0"}'"""
    )
    args = argparse.Namespace(clients=1000, threads=1)
    rounds, about = side_by_side.run_pfl(python, args, per_round=10, rounds=2, evaluate=False)
    np.testing.assert_array_equal(rounds, [[2.0, 1.5], [1.0, 0.5]])
    assert about["pfl"] == "0.6.0"


def test_a_failing_simulator_raises_with_its_error(side_by_side, tmp_path: Path) -> None:
    python = fake_python(tmp_path, "echo 'pfl ran 1 rounds, expected 3' >&2; exit 1")
    with pytest.raises(RuntimeError, match=r"exited with 1: pfl ran 1 rounds, expected 3"):
        side_by_side.run_pfl(python, argparse.Namespace(clients=10, threads=1), per_round=2, rounds=3, evaluate=True)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--warmup", "0"], "--warmup must be >= 1, got 0"),  # pfl's first round always evaluates: never timed
        (["--per-round", "10", "2000"], r"--per-round must lie in 1..--clients \(1000\), got \[10, 2000\]"),
    ],
)
def test_bad_arguments_are_refused_by_name(side_by_side, capsys: pytest.CaptureFixture[str], argv, message) -> None:
    with pytest.raises(SystemExit):
        side_by_side.main(argv)
    assert re.search(message, capsys.readouterr().err)
