"""MultiHotRows against dense rows built with NumPy (np.add.at, then divided): any index form, empty rows,
repeated ids, zero divisors, and through client_batches' fast path."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fl_lightning.data import client_batches
from fl_lightning.data.datasets.multi_hot import MultiHotRows


def dense_reference(ids: list[list[int]], width: int, divisors: list[float]) -> np.ndarray:
    out = np.zeros((len(ids), width))
    for row, columns in enumerate(ids):
        np.add.at(out[row], columns, 1.0)
        out[row] = out[row] / divisors[row] if divisors[row] else 0.0
    return out


def test_rows_equal_the_dense_reference_for_every_index_form() -> None:
    rng = np.random.default_rng(0)
    ids = [rng.integers(0, 7, rng.integers(0, 6)).tolist() for _ in range(9)] + [[3, 3, 3], []]
    divisors = [float(d) for d in rng.integers(0, 5, len(ids))]
    rows, reference = MultiHotRows(ids, 7, divisors), dense_reference(ids, 7, divisors)
    assert len(rows) == 11
    np.testing.assert_allclose(rows[4].numpy(), reference[4], rtol=1e-6)
    np.testing.assert_allclose(rows[torch.tensor([10, 9, 0, 9])].numpy(), reference[[10, 9, 0, 9]], rtol=1e-6)
    np.testing.assert_allclose(rows[np.arange(11)].numpy(), reference, rtol=1e-6)
    np.testing.assert_allclose(rows[-1].numpy(), reference[-1])
    np.testing.assert_allclose(rows[-11].numpy(), reference[0], rtol=1e-6)
    with pytest.raises(IndexError, match=r"row indices must be in \[-11, 11\), got 11"):
        rows[11]
    assert MultiHotRows([[1, 1], []], 3)[torch.tensor([0, 1])].tolist() == [[0, 2, 0], [0, 0, 0]]  # repeats add up


def test_client_batches_slice_the_rows_per_batch() -> None:
    ids = [[0], [1, 2], [2], [0, 0]]

    class Samples:
        tensors = (MultiHotRows(ids, 3, [1, 2, 1, 2]), MultiHotRows([[0], [1], [0], [1]], 2))

    stream = client_batches(Samples(), np.arange(4), batch_size=3, generator=torch.Generator(), shuffle=False, num_epochs=1)
    batches = list(stream)
    assert [x.tolist() for x, _ in batches] == [[[1, 0, 0], [0, 0.5, 0.5], [0, 0, 1]], [[1, 0, 0]]]
    assert [y.tolist() for _, y in batches] == [[[1, 0], [0, 1], [1, 0]], [[0, 1]]]


def test_bad_ids_and_divisors_are_named() -> None:
    with pytest.raises(ValueError, match=r"column ids must be in \[0, 3\), got ids from 0 to 3"):
        MultiHotRows([[0, 3]], 3)
    with pytest.raises(ValueError, match="divisors has 1 values for 2 rows"):
        MultiHotRows([[0], [1]], 3, [1.0])
