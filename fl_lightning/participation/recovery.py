"""How fast training recovers from an objective shift: the measures of Ruan et al. 2021, Tables 4 and 5.

Both read per-round curves of the global model, where entry ``r`` is its metric after round ``r``
(0-based) on the test set of the objective at that round, and the event happens at round
``tau0`` (the first round that trains with the arrived device, or without the departed one).
Both count rounds from ``tau0`` inclusive, so 1 means "recovered after the first round".
"""

from __future__ import annotations

from collections.abc import Sequence


def _check(curves: Sequence[Sequence[float]], tau0: int) -> None:
    if tau0 < 1:
        raise ValueError(f"The event round tau0 must be >= 1 (a round before it is needed), got {tau0}.")
    for curve in curves:
        if len(curve) <= tau0:
            raise ValueError(f"A curve of {len(curve)} rounds has no round at or after tau0={tau0}.")


def recovery_rounds(accuracy: Sequence[float], tau0: int) -> int | None:
    r"""Table 4: rounds after an arrival at ``tau0`` until the test accuracy is back to its value
    at :math:`\tau_0 - 1`, i.e. the least :math:`k \ge 1` with
    :math:`\mathrm{acc}_{\tau_0+k-1} \ge \mathrm{acc}_{\tau_0-1}`; ``None`` if it never is.

    >>> recovery_rounds([0.5, 0.7, 0.4, 0.6, 0.7, 0.8], tau0=2)
    3
    """
    _check([accuracy], tau0)
    target = accuracy[tau0 - 1]
    return next((r - tau0 + 1 for r in range(tau0, len(accuracy)) if accuracy[r] >= target), None)


def crossing_rounds(shifted: Sequence[float], kept: Sequence[float], tau0: int) -> int | None:
    r"""Table 5: rounds after a departure at ``tau0`` until the test loss of the shifted objective
    ("exclude") comes down to that of the kept one ("include"), i.e. the least :math:`k \ge 1`
    with :math:`\mathrm{shifted}_{\tau_0+k-1} \le \mathrm{kept}_{\tau_0+k-1}`; ``None`` if never.

    >>> crossing_rounds([1.0, 0.9, 1.5, 1.0, 0.7], [1.0, 0.9, 0.85, 0.8, 0.75], tau0=2)
    3
    """
    _check([shifted, kept], tau0)
    horizon = min(len(shifted), len(kept))
    return next((r - tau0 + 1 for r in range(tau0, horizon) if shifted[r] <= kept[r]), None)
