"""Checks that saved state is what a run can produce, for each stateful component's ``load_state_dict``.

A checkpoint's state decides numbers and guarantees (a privacy ledger, optimizer moments, control variates,
cluster weights): a value no run can produce (a negative second moment, a 3rd centre for 2 clusters, a NaN
clock) means the file was edited or written by something else, and is refused with :class:`InvalidStateError`
naming the entry and what is allowed, before it is used. The loop adds the checkpoint's name.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor


class InvalidStateError(ValueError):
    """Saved state holds a value that no run of this configuration can produce."""


def check_tensor(
    name: str, value: Any, *, shape: Sequence[int] | None = None, low: float | None = None, high: float | None = None
) -> Tensor:
    """``value``, checked to be a finite tensor of ``shape`` (when given) with every element in ``[low, high]``."""
    if not isinstance(value, Tensor):
        raise InvalidStateError(f"`{name}` must be a tensor, got {type(value).__name__}.")
    if shape is not None and tuple(value.shape) != tuple(shape):
        raise InvalidStateError(f"`{name}` must have shape {list(shape)}, got {list(value.shape)}.")
    if value.is_floating_point() and not torch.isfinite(value).all():
        raise InvalidStateError(f"`{name}` holds NaN or Inf.")
    if value.numel() and low is not None and float(value.min()) < low:
        raise InvalidStateError(f"`{name}` must be >= {low:g}, got a minimum of {float(value.min()):g}.")
    if value.numel() and high is not None and float(value.max()) > high:
        raise InvalidStateError(f"`{name}` must be <= {high:g}, got a maximum of {float(value.max()):g}.")
    return value


def check_number(name: str, value: Any, *, low: float = -math.inf, high: float = math.inf) -> float:
    """``value``, checked to be a finite int or float (not a bool) in ``[low, high]``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or not low <= value <= high:
        raise InvalidStateError(f"`{name}` must be a finite number in [{low:g}, {high:g}], got {value!r}.")
    return float(value)


def check_client_id(name: str, value: Any, num_clients: int) -> int:
    """``value``, checked to be a client id of a federation of ``num_clients``."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < num_clients:
        raise InvalidStateError(f"`{name}` must be a client id in 0..{num_clients - 1}, got {value!r}.")
    return value
