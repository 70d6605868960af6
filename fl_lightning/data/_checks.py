"""Argument and partition validation shared by the data package."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def check_int(name: str, value: object, *, minimum: int) -> int:
    """Returns ``value`` as an ``int``, or raises ``ValueError`` naming it and the allowed range."""
    # bool is an int subclass, but ``num_clients=True`` is always a mistake.
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}.")
    return int(value)


def check_choice(name: str, value: object, choices: Sequence[object]) -> None:
    """Raises ``ValueError`` unless ``value`` is one of ``choices``."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {list(choices)}, got {value!r}.")


def check_partition(
    parts: Sequence[Sequence[int] | np.ndarray], *, num_clients: int, num_samples: int, source: str
) -> list[np.ndarray]:
    """Validates a partition and returns it as sorted ``int64`` arrays.

    Args:
        parts: One index collection per client.
        num_clients: The expected number of clients.
        num_samples: Indices must lie in ``[0, num_samples)``.
        source: Where the partition came from, for error messages.

    Raises:
        ValueError: On a wrong client count, an empty client, an index out of range or an index
            given to more than one client.
    """
    if len(parts) != num_clients:
        raise ValueError(f"{source} has {len(parts)} clients but num_clients={num_clients}.")
    arrays = [np.sort(np.asarray(part, dtype=np.int64).reshape(-1)) for part in parts]
    for cid, indices in enumerate(arrays):
        if indices.size == 0:
            raise ValueError(
                f"{source} left client {cid} empty ({num_samples} samples, {num_clients} clients); use fewer clients."
            )
        if indices[0] < 0 or indices[-1] >= num_samples:
            bad = indices[0] if indices[0] < 0 else indices[-1]
            raise ValueError(f"{source}: client {cid} has index {bad} outside [0, {num_samples}).")
    merged = np.sort(np.concatenate(arrays))
    repeated = merged[1:][merged[1:] == merged[:-1]]
    if repeated.size:
        raise ValueError(f"{source}: index {repeated[0]} is assigned to more than one client.")
    return arrays
