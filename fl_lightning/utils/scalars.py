"""0-d tensors read as Python floats with at most one device sync."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


def read_scalars(values: Sequence[Tensor]) -> list[float]:
    """The values of the 0-d tensors ``values``, in order: on the CPU ``item()`` each (no sync to save, and for a few
    values under half of ``stack``'s cost, which runs once per client), elsewhere one ``stack`` read at once."""
    if not values:
        return []
    if values[0].is_cpu:
        return [value.item() for value in values]
    return torch.stack(list(values)).tolist()
