"""read_scalars: 0-d tensors as Python floats, in order, whatever their dtype."""

from __future__ import annotations

import math

import pytest
import torch

from fl_lightning.utils.scalars import read_scalars


def test_values_in_order_exactly_as_stored() -> None:
    values = [torch.tensor(0.1), torch.tensor(2.5, dtype=torch.bfloat16), torch.tensor(-3.0, dtype=torch.float64)]
    assert read_scalars(values) == [torch.tensor(0.1).item(), 2.5, -3.0]  # float32 0.1, not the double 0.1
    assert read_scalars([]) == []
    nan, inf = read_scalars([torch.tensor(math.nan), torch.tensor(-math.inf)])
    assert math.isnan(nan) and inf == -math.inf


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_device_values_are_read_at_once() -> None:
    values = [torch.tensor(1.5, device="cuda"), torch.tensor(-2.0, device="cuda")]
    assert read_scalars(values) == [1.5, -2.0]
