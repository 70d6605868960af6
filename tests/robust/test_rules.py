"""The robust rules against NumPy references on hand-made updates."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fl_lightning.robust import rules

# Five honest updates near (1, 1, 1) and two Byzantine ones far away.
UPDATES = np.array(
    [
        [1.0, 1.1, 0.9],
        [0.9, 1.0, 1.2],
        [1.2, 0.8, 1.0],
        [1.1, 1.0, 1.1],
        [1.0, 0.9, 0.8],
        [50.0, -40.0, 30.0],
        [-60.0, 45.0, 100.0],
    ]
)


def _numpy_krum_scores(x: np.ndarray, f: int) -> np.ndarray:
    n = len(x)
    scores = []
    for i in range(n):
        d = sorted(float(np.sum((x[i] - x[j]) ** 2)) for j in range(n) if j != i)
        scores.append(sum(d[: n - f - 2]))
    return np.array(scores)


def _numpy_bulyan(x: np.ndarray, f: int) -> np.ndarray:
    pool, selected = list(range(len(x))), []
    for _ in range(len(x) - 2 * f):
        sub = x[pool]
        k = max(len(pool) - f - 2, 1)
        scores = [
            sum(sorted(float(np.sum((sub[i] - sub[j]) ** 2)) for j in range(len(sub)) if j != i)[:k]) for i in range(len(sub))
        ]
        selected.append(pool.pop(int(np.argmin(scores))))
    chosen = x[selected]
    beta = len(selected) - 2 * f
    med = np.median(chosen, axis=0)
    out = []
    for c in range(x.shape[1]):
        order = np.argsort(np.abs(chosen[:, c] - med[c]), kind="stable")[:beta]
        out.append(chosen[order, c].mean())
    return np.array(out)


def _t(x: np.ndarray) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.float64)


@pytest.mark.parametrize("n", [6, 7])  # even and odd counts
def test_coordinate_median_is_numpys(n):
    np.testing.assert_allclose(rules.coordinate_median(_t(UPDATES[:n])).numpy(), np.median(UPDATES[:n], axis=0))


@pytest.mark.parametrize("beta", [0.0, 0.2, 0.3, 0.49])
def test_trimmed_mean_is_the_numpy_reference(beta):
    k = int(np.floor(beta * len(UPDATES)))
    expected = np.sort(UPDATES, axis=0)[k : len(UPDATES) - k].mean(axis=0)
    np.testing.assert_allclose(rules.trimmed_mean(_t(UPDATES), beta).numpy(), expected)
    if beta == 0.3:  # 2 trimmed at each end: the attackers' coordinates are gone
        assert np.all(np.abs(expected - 1.0) < 0.2)


def test_krum_scores_and_choice_are_numpys():
    scores = _numpy_krum_scores(UPDATES, f=2)
    np.testing.assert_allclose(rules.krum_scores(_t(UPDATES), 2).numpy(), scores)
    np.testing.assert_allclose(rules.multi_krum(_t(UPDATES), 2).numpy(), UPDATES[np.argmin(scores)])
    best3 = np.argsort(scores, kind="stable")[:3]
    np.testing.assert_allclose(rules.multi_krum(_t(UPDATES), 2, num_selected=3).numpy(), UPDATES[best3].mean(axis=0))
    assert set(best3) <= set(range(5))  # honest updates only


def test_bulyan_is_the_numpy_reference():
    x = np.concatenate([UPDATES[:5], UPDATES[:5] + 0.05, UPDATES[5:6]])  # n = 11 >= 4f + 3 for f = 2
    expected = _numpy_bulyan(x, 2)
    np.testing.assert_allclose(rules.bulyan(_t(x), 2).numpy(), expected)
    assert np.all(np.abs(expected - 1.0) < 0.25)


@pytest.mark.parametrize(("n", "f"), [(6, 2), (4, 1), (2, 0)])
def test_krum_refuses_n_at_most_2f_plus_2(n, f):
    with pytest.raises(ValueError, match=rf"n > 2f \+ 2 .*n={n} for f={f}"):
        rules.krum_scores(_t(UPDATES[:n]), f)


def test_bulyan_and_trimmed_mean_refuse_bad_sizes():
    with pytest.raises(ValueError, match=r"n >= 4f \+ 3.*n=7 for f=2"):
        rules.bulyan(_t(UPDATES), 2)
    with pytest.raises(ValueError, match="beta"):
        rules.trimmed_mean(_t(UPDATES), 0.5)
