"""The server's validation split, taken out of the training set before it is partitioned."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

# Entropy appended to the seed, so that the split is independent of the partition (which uses
# ``default_rng(seed)``) and of the clients' held-out split (stream 1).
_VALIDATION_STREAM = 2


class ValidationSplit(NamedTuple):
    """Sorted, read-only training-set indices: the server's validation samples and the clients' pool."""

    validation: np.ndarray
    pool: np.ndarray


def check_val_fraction(value: object) -> float:
    """Returns ``value`` as a float, or raises ``ValueError`` naming it and the allowed range (0, 1)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1:
        raise ValueError(f"val_fraction must be a float in (0, 1) (exclusive), got {value!r}.")
    return float(value)


def split_validation(num_samples: int, fraction: float, seed: int) -> ValidationSplit:
    """A uniformly random ``fraction`` of ``range(num_samples)`` (at least one sample, never all), from ``seed`` alone.

    Example:
        >>> split = split_validation(10, 0.2, seed=0)
        >>> len(split.validation), len(split.pool)
        (2, 8)
    """
    num_val = min(num_samples - 1, max(1, round(fraction * num_samples)))
    order = np.random.default_rng([seed, _VALIDATION_STREAM]).permutation(num_samples)
    validation, pool = np.sort(order[:num_val]), np.sort(order[num_val:])
    validation.flags.writeable = pool.flags.writeable = False
    return ValidationSplit(validation, pool)
