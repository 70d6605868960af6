"""Argument validation shared by the participation models."""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import Any

import numpy as np


def check_int(name: str, value: object, *, minimum: int) -> int:
    """Returns ``value`` as an ``int``, or raises ``ValueError`` naming it and the allowed range."""
    # bool is an int subclass, but ``client=True`` is always a mistake.
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"`{name}` must be an int >= {minimum}, got {value!r}.")
    return int(value)


def check_requested(requested: object) -> int:
    """Validates the requested number of local steps :math:`E`."""
    if isinstance(requested, bool) or not isinstance(requested, (int, np.integer)) or requested < 1:
        raise ValueError(f"The requested number of local steps E must be >= 1, got requested={requested!r}.")
    return int(requested)


def _is_real(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_probabilities(name: str, value: float | Sequence[float]) -> float | tuple[float, ...]:
    """Validates a scalar or per-client probability; returns a float or a tuple of floats."""
    if _is_real(value):
        # ``not 0 <= q <= 1`` also rejects NaN.
        if not 0.0 <= value <= 1.0:  # type: ignore[operator]
            raise ValueError(f"`{name}` must be in [0, 1], got {value!r}.")
        return float(value)  # type: ignore[arg-type]
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or len(value) == 0:
        raise ValueError(f"`{name}` must be a probability or a non-empty per-client sequence, got {value!r}.")
    for client, q in enumerate(value):
        if not _is_real(q) or not 0.0 <= q <= 1.0:
            raise ValueError(f"`{name}` must be in [0, 1], got {q!r} for client {client}.")
    return tuple(float(q) for q in value)


def per_client(owner: str, name: str, value: Any, num_clients: int) -> tuple[Any, ...]:
    """Broadcasts a scalar to ``num_clients`` values, or checks a per-client tuple's length."""
    if not isinstance(value, tuple):
        return (value,) * num_clients
    if len(value) != num_clients:
        raise ValueError(f"{owner}: got {len(value)} per-client values of `{name}` for num_clients={num_clients}.")
    return value
