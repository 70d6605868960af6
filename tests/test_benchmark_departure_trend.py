"""Table 5's tau0 trend in ``benchmarks/flexible_events.py``: per-seed crossings and areas, and the
paired differences across tau0 (checked against a NumPy/SciPy t-interval, not the script's rule)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from scipy import stats

from .benchmark_scripts import import_benchmark

HORIZON = 6


@pytest.fixture
def departure_trend(monkeypatch: pytest.MonkeyPatch):
    return import_benchmark(monkeypatch, "flexible_events").departure_trend


def curves(crossing: int | None) -> tuple[SimpleNamespace, SimpleNamespace]:
    """(exclude, include) runs whose exclude loss is above include's until ``crossing`` (``None``: never)."""
    above = HORIZON if crossing is None else crossing - 1
    exclude = [1.0] + [2.0] * above + [0.5] * (HORIZON - above)
    return SimpleNamespace(losses=exclude), SimpleNamespace(losses=[1.0] * (HORIZON + 1))


def test_paired_differences_of_later_tau0_minus_the_first(departure_trend) -> None:
    crossings = {10: [1, 2, 3, None], 30: [2, 2, 5, 4], 50: [4, 3, 6, 6]}
    seeds = [0, 1, 2, 3]
    by = {}
    for tau0, per_seed in crossings.items():
        for seed, c in zip(seeds, per_seed):
            by[(1.0, 1.0, tau0, "exclude", seed)], by[(1.0, 1.0, tau0, "include", seed)] = curves(c)
    lines = departure_trend(by, seeds, HORIZON)

    assert "| (1, 1) | 10 | 1, 2, 3, >6 | -3.00, -1.50, 0.00, 6.00 |" in lines
    row = next(line for line in lines if "| 50 − 10 |" in line).split(" | ")
    # Crossing: only the 3 seeds that cross at both tau0; area: all 4 seeds.
    d = np.array([3.0, 1.0, 3.0])
    half = stats.t.ppf(0.975, 2) * d.std(ddof=1) / np.sqrt(3)
    assert row[3] == f"[{d.mean() - half:.3f}, {d.mean() + half:.3f}] no"  # 2.33 ± 2.87
    assert row[4] == "3/4"
    area = lambda c: (c - 1) * 1.0 - (HORIZON - c + 1) * 0.5  # noqa: E731 (exclude above include by 1, then below by 0.5)
    a = np.array([area(4) - area(1), area(3) - area(2), area(6) - area(3), area(6) - HORIZON * 1.0])
    half = stats.t.ppf(0.975, 3) * a.std(ddof=1) / np.sqrt(4)
    assert row[6] == f"[{a.mean() - half:.3f}, {a.mean() + half:.3f}] {'yes' if abs(a.mean()) > half else 'no'} |"
    assert any("| 30 − 10 |" in line for line in lines)
