"""Rows of a wide, mostly-zero matrix kept as their column ids, made dense only for the rows a batch indexes.

A Stack Overflow post's bag of words is 10,000 floats dense but a few dozen ids sparse: a client of
100,000 posts holds megabytes of ids instead of 4 GB of floats, and a batch of ``B`` posts is
``[B, width]`` only while it trains.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor


class MultiHotRows:
    """``n`` rows of width ``width``: row ``i`` counts each id of ``ids[i]`` (repeats add up), divided by
    ``divisors[i]`` (a zero divisor leaves the row zero: TensorFlow's ``divide_no_nan``).

    Indexed like the client tensors :func:`~fl_lightning.data.client_batches` slices: an ``int`` gives one
    ``[width]`` row, an index tensor or array ``[B, width]`` rows (``float32``).

    Args:
        ids: Each row's column ids, each in ``[0, width)``.
        width: Number of columns.
        divisors: Each row's divisor (default: 1, the counts themselves).
    """

    def __init__(self, ids: Sequence[Sequence[int]], width: int, divisors: Sequence[float] | None = None) -> None:
        self.width = width
        lengths = np.fromiter((len(row) for row in ids), dtype=np.int64, count=len(ids))
        self._offsets = torch.from_numpy(np.concatenate([[0], np.cumsum(lengths)]))
        flat = np.fromiter((i for row in ids for i in row), dtype=np.int64, count=int(lengths.sum()))
        if flat.size and not (0 <= flat.min() and flat.max() < width):
            raise ValueError(f"column ids must be in [0, {width}), got ids from {flat.min()} to {flat.max()}.")
        self._ids = torch.from_numpy(flat)
        self._divisors = torch.ones(len(ids)) if divisors is None else torch.as_tensor(divisors, dtype=torch.float32)
        if len(self._divisors) != len(ids):
            raise ValueError(f"divisors has {len(self._divisors)} values for {len(ids)} rows.")

    @property
    def device(self) -> torch.device:
        """Where the rows are built (the CPU): :func:`~fl_lightning.data.client_batches` gathers its indices there."""
        return self._ids.device

    def __len__(self) -> int:
        return len(self._divisors)

    def __getitem__(self, index: int | Tensor | np.ndarray) -> Tensor:
        rows = torch.as_tensor(index, dtype=torch.int64)
        if rows.numel() and not (-len(self) <= int(rows.min()) and int(rows.max()) < len(self)):
            raise IndexError(f"row indices must be in [-{len(self)}, {len(self)}), got {index!r}.")
        dense = self._dense(torch.where(rows < 0, rows + len(self), rows).reshape(-1))
        return dense[0] if rows.dim() == 0 else dense

    def _dense(self, rows: Tensor) -> Tensor:
        starts, lengths = self._offsets[rows], self._offsets[rows + 1] - self._offsets[rows]
        # Position j of the concatenated selected rows is the id at starts[row] + (j - first position of row).
        first = torch.cumsum(lengths, 0) - lengths
        positions = torch.arange(int(lengths.sum())) + (starts - first).repeat_interleave(lengths)
        row_of = torch.arange(len(rows)).repeat_interleave(lengths)
        flat = row_of * self.width + self._ids[positions]
        out = torch.zeros(len(rows) * self.width)
        out.index_add_(0, flat, torch.ones(len(flat)))
        # Only the filled entries are divided (counts / divisor, as TFF computes them): a batch is mostly zeros.
        divisors = self._divisors[rows][row_of]
        out[flat] = torch.where(divisors > 0, out[flat] / divisors, 0.0)  # the discarded quotients of 0 are NaN
        return out.view(len(rows), self.width)
