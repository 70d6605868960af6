"""Byzantine-robust aggregation rules over a matrix of flattened client updates (one row per client).

Pure functions of an ``(n, d)`` float tensor returning a ``(d,)`` aggregate; every client
counts once (sample counts are ignored: a Byzantine client could lie about them).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def coordinate_median(updates: Tensor) -> Tensor:
    """The coordinate-wise median (Yin et al. 2018, "Byzantine-Robust Distributed Learning", Def. 1);
    for an even count, the mean of the two middle values (as ``numpy.median``)."""
    ordered = updates.sort(dim=0).values
    n = len(updates)
    return (ordered[(n - 1) // 2] + ordered[n // 2]) / 2


def trimmed_mean(updates: Tensor, beta: float) -> Tensor:
    """The coordinate-wise β-trimmed mean (Yin et al. 2018, Def. 2): per coordinate, the mean of the
    values left after removing the :math:`\\lfloor\\beta n\\rfloor` largest and smallest."""
    if not 0 <= beta < 0.5:
        raise ValueError(f"`beta` must be in [0, 0.5), got {beta!r}.")
    n = len(updates)
    cut = math.floor(beta * n)
    return updates.sort(dim=0).values[cut : n - cut].mean(dim=0)


def check_krum(n: int, num_byzantine: int) -> None:
    """Krum's condition :math:`n > 2f + 2` (Blanchard et al. 2017, Prop. 1), with the values named."""
    if not n > 2 * num_byzantine + 2:
        raise ValueError(
            f"Krum needs n > 2f + 2 updates: got n={n} for f={num_byzantine} Byzantine clients "
            f"(at least {2 * num_byzantine + 3} updates, or a smaller num_byzantine)."
        )


def krum_scores(updates: Tensor, num_byzantine: int) -> Tensor:
    r"""Krum's score of each update, :math:`s(i) = \sum_{i \to j} \lVert V_i - V_j\rVert^2` over its
    :math:`n - f - 2` nearest neighbours (Blanchard et al. 2017, §4)."""
    n = len(updates)
    check_krum(n, num_byzantine)
    return _neighbour_scores(updates, n - num_byzantine - 2)


def _neighbour_scores(updates: Tensor, neighbours: int) -> Tensor:
    distances = torch.cdist(updates, updates).square()
    distances.fill_diagonal_(math.inf)  # a vector is not its own neighbour
    return distances.sort(dim=1).values[:, :neighbours].sum(dim=1)


def multi_krum(updates: Tensor, num_byzantine: int, num_selected: int = 1) -> Tensor:
    """The mean of the ``num_selected`` updates of lowest Krum score (Blanchard et al. 2017, §4,
    Multi-Krum; ``num_selected=1`` is Krum itself). Ties go to the lower index."""
    if not 1 <= num_selected <= len(updates):
        raise ValueError(f"`num_selected` must be in 1..{len(updates)}, got {num_selected}.")
    order = torch.argsort(krum_scores(updates, num_byzantine), stable=True)
    return updates[order[:num_selected]].mean(dim=0)


def bulyan(updates: Tensor, num_byzantine: int) -> Tensor:
    r"""Bulyan (El Mhamdi et al. 2018, "The Hidden Vulnerability of Distributed Learning in
    Byzantium", Algorithm 1) over Krum: select :math:`\theta = n - 2f` updates by Krum one at a time,
    removing each from the pool; then per coordinate average the :math:`\beta = \theta - 2f` selected
    values closest to their median. Needs :math:`n \ge 4f + 3`.

    The pool shrinks to :math:`2f + 1`, below Krum's own :math:`n > 2f + 2`; as the paper leaves
    this open, a pool of :math:`p` updates scores each by its :math:`\max(p - f - 2, 1)` nearest neighbours."""
    n, f = len(updates), num_byzantine
    if not n >= 4 * f + 3:
        raise ValueError(f"Bulyan needs n >= 4f + 3 updates: got n={n} for f={f} Byzantine clients.")
    pool = list(range(n))
    selected = []
    for _ in range(n - 2 * f):
        scores = _neighbour_scores(updates[pool], max(len(pool) - f - 2, 1))
        selected.append(pool.pop(int(torch.argmin(scores))))
    chosen = updates[selected]
    beta = len(selected) - 2 * f
    median = coordinate_median(chosen)
    closest = (chosen - median).abs().argsort(dim=0, stable=True)[:beta]
    return chosen.gather(0, closest).mean(dim=0)
