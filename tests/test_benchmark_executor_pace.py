"""``benchmarks/executor_pace.py``'s pooled percentiles: each loop's own percentile of every round, then the ratio."""

from __future__ import annotations

import numpy as np
import pytest

from .benchmark_scripts import import_benchmark


@pytest.fixture
def pooled_percentiles(monkeypatch: pytest.MonkeyPatch):
    return import_benchmark(monkeypatch, "executor_pace").pooled_percentiles


def test_percentiles_of_each_loop_then_their_ratio(pooled_percentiles) -> None:
    plain = [0.010, 0.030, 0.020, 0.050]  # seconds per round, two repeats pooled
    auto = [0.022, 0.011, 0.090, 0.033]
    rows = [line for line in pooled_percentiles(plain, auto, (0, 50)) if line.startswith("| 0") or line.startswith("| 50")]
    low, mid = (float(np.percentile(v, 50)) * 1e3 for v in (plain, auto))
    assert rows == ["| 0 | 10.00 | 11.00 | 1.100x |", f"| 50 | {low:.2f} | {mid:.2f} | {mid / low:.3f}x |"]
