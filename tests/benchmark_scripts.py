"""Importing a ``benchmarks/`` script in a test as it runs: its siblings import as top-level modules."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def import_benchmark(monkeypatch: pytest.MonkeyPatch, name: str) -> ModuleType:
    """Benchmark script ``name``, imported afresh with ``benchmarks/`` on ``sys.path`` for the test."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    monkeypatch.delitem(sys.modules, name, raising=False)
    return importlib.import_module(name)
