"""The smallest noise multiplier that meets a target ε over a run's rounds (as Opacus's and pfl's calibration do)."""

from __future__ import annotations

import math
from collections.abc import Callable

from fl_lightning.robust.update_bounds import positive_finite

#: The calibrated multiplier is at most this much (relatively) above the smallest one that meets the target.
RELATIVE_PRECISION = 1e-3
#: No multiplier above this is tried: a target it cannot meet is refused.
_LARGEST = 1e4


def calibrate_noise_multiplier(epsilon_of: Callable[[float], float], target_epsilon: float, what: str) -> float:
    r"""The smallest :math:`z` (to :data:`RELATIVE_PRECISION`, rounded up) with ``epsilon_of(z) <= target_epsilon``,
    by bisection on :math:`\log z` (ε decreases in :math:`z` for every accountant here). ``what`` names the run's
    setting in the error raised when even :math:`z = 10^4` spends more."""
    if epsilon_of(_LARGEST) > target_epsilon:
        raise ValueError(
            f"No noise_multiplier up to {_LARGEST:g} keeps epsilon <= target_epsilon={target_epsilon} over {what}: "
            "raise target_epsilon or lower the rounds."
        )
    low, high = 1e-3, 1.0
    while epsilon_of(high) > target_epsilon:
        low, high = high, min(high * 4, _LARGEST)
    if epsilon_of(low) <= target_epsilon:
        return low
    while high / low > 1 + RELATIVE_PRECISION:
        middle = math.sqrt(low * high)
        low, high = (low, middle) if epsilon_of(middle) <= target_epsilon else (middle, high)
    return high


def noise_request(owner: str, noise_multiplier: float | None, target_epsilon: float | None) -> tuple[float, float | None]:
    """``(z, target_epsilon)``, each checked; :math:`z` is 0 until set-up calibrates it when ``noise_multiplier`` is
    ``None``, which needs a ``target_epsilon`` (else one error naming ``owner``)."""
    target = None if target_epsilon is None else positive_finite("target_epsilon", target_epsilon)
    if noise_multiplier is None and target is None:
        raise ValueError(f"{owner} needs `noise_multiplier`, or `target_epsilon` to calibrate it from (noise_multiplier=None).")
    z = 0.0 if noise_multiplier is None else positive_finite("noise_multiplier", noise_multiplier, inclusive=True)
    return z, target
