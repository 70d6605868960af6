"""Argument and partition validation shared by the data package."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


class ClientDataError(ValueError):
    """A client's data that the model cannot train on as configured (e.g. a 1-sample batch under BatchNorm):
    the configuration's fault, so ``fl-lightning`` reports it as one ``error:`` line even mid-run."""


def check_int(name: str, value: object, *, minimum: int) -> int:
    """Returns ``value`` as an ``int``, or raises ``ValueError`` naming it and the allowed range."""
    # bool is an int subclass, but ``num_clients=True`` is always a mistake.
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}.")
    return int(value)


def check_bool(name: str, value: object) -> bool:
    """Returns ``value``, or raises ``ValueError`` naming it unless it is a ``bool``."""
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be a bool (true or false), got {value!r}.")
    return value


def check_choice(name: str, value: object, choices: Sequence[object]) -> None:
    """Raises ``ValueError`` unless ``value`` is one of ``choices``."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {list(choices)}, got {value!r}.")


def out_of_range(source: str, cid: int, position: int, index: int, num_samples: int) -> ValueError:
    """The error for entry ``position`` of client ``cid`` being ``index``, outside ``[0, num_samples)``."""
    return ValueError(f"{source}: client {cid} has index {index} outside [0, {num_samples}) at entry {position}.")


def check_partition(
    parts: Sequence[Sequence[int] | np.ndarray], *, num_clients: int, num_samples: int, source: str, sort: bool = True
) -> list[np.ndarray]:
    """Validates a partition and returns it as ``int64`` arrays, sorted unless ``sort=False``.

    Errors name the client and the entry (its position in the client's indices as given).

    Args:
        parts: One index collection per client.
        num_clients: The expected number of clients.
        num_samples: Indices must lie in ``[0, num_samples)``.
        source: Where the partition came from, for error messages.
        sort: Sort each client's indices (``False``: keep the order given).

    Raises:
        ValueError: On a wrong client count, an empty client, an index out of range or an index
            given twice (to one client or to two).
    """
    if len(parts) != num_clients:
        raise ValueError(f"{source} has {len(parts)} clients but num_clients={num_clients}.")
    arrays = [np.asarray(part, dtype=np.int64).reshape(-1) for part in parts]
    for cid, indices in enumerate(arrays):
        if indices.size == 0:
            raise ValueError(
                f"{source} left client {cid} empty ({num_samples} samples, {num_clients} clients); use fewer clients."
            )
        outside = np.flatnonzero((indices < 0) | (indices >= num_samples))
        if outside.size:
            raise out_of_range(source, cid, int(outside[0]), int(indices[outside[0]]), num_samples)
    _check_disjoint(arrays, source)
    return [np.sort(indices) for indices in arrays] if sort else arrays


def _check_disjoint(arrays: Sequence[np.ndarray], source: str) -> None:
    """Raises ``ValueError`` naming both places of the first index that is given twice."""
    merged = np.concatenate(arrays)
    order = np.argsort(merged, kind="stable")  # stable: of two equal indices, the earlier place comes first
    ordered = merged[order]
    repeated = np.flatnonzero(ordered[1:] == ordered[:-1])
    if not repeated.size:
        return
    starts = np.cumsum([0] + [indices.size for indices in arrays])
    (first, first_entry), (second, second_entry) = (_place(starts, int(at)) for at in order[repeated[0] : repeated[0] + 2])
    index = ordered[repeated[0]]
    if first == second:
        raise ValueError(f"{source}: client {first} has index {index} twice, at entries {first_entry} and {second_entry}.")
    raise ValueError(
        f"{source}: index {index} is assigned to more than one client: "
        f"client {first} (entry {first_entry}) and client {second} (entry {second_entry})."
    )


def _place(starts: np.ndarray, flat: int) -> tuple[int, int]:
    """``(client, entry)`` of position ``flat`` in the clients' concatenated indices (``starts``: their offsets)."""
    cid = int(np.searchsorted(starts, flat, side="right")) - 1
    return cid, flat - int(starts[cid])
