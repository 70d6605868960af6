import numpy as np
import pytest
import torch

from fl_lightning.data import InMemoryDataset


def test_exposes_tensors_targets_and_tuples() -> None:
    data = InMemoryDataset(
        inputs=torch.randn(5, 3), labels=torch.tensor([0, 1, 2, 1, 0], dtype=torch.int32), num_classes=3
    )
    assert len(data) == 5
    x, y = data[2]
    assert x.shape == (3,) and y.item() == 2
    assert data.tensors[1].dtype == torch.int64
    np.testing.assert_array_equal(data.targets, [0, 1, 2, 1, 0])
    assert data.targets.dtype == np.int64


@pytest.mark.parametrize(
    ("labels", "match"),
    [
        (torch.zeros(4, dtype=torch.int64), r"labels must have shape \[5\] to match inputs, got \[4\]"),
        (torch.zeros(5), r"labels must be integers, got dtype torch.float32"),
        (torch.tensor([0, 1, 2, 3, 4]), r"labels must lie in \[0, 3\), got range \[0, 4\]"),
    ],
)
def test_bad_labels(labels: torch.Tensor, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        InMemoryDataset(inputs=torch.randn(5, 3), labels=labels, num_classes=3)
