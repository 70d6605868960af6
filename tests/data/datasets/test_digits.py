import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits

from fl_lightning.data import Digits


def test_splits_partition_the_1797_samples() -> None:
    train, test = Digits(), Digits(split="test")
    assert len(train) + len(test) == 1797
    assert len(test) == 360
    # Together the splits hold every sample exactly once.
    joined = torch.cat([train.tensors[0], test.tensors[0]]).numpy()
    full = (load_digits().data / 16.0).astype(np.float32)
    np.testing.assert_array_equal(joined[np.lexsort(joined.T)], full[np.lexsort(full.T)])


def test_features_are_scaled_to_unit_range() -> None:
    x, y = Digits().tensors
    assert x.dtype == torch.float32 and x.shape[1:] == (64,)
    assert x.min() == 0 and x.max() == 1
    assert y.dtype == torch.int64


def test_as_image() -> None:
    data = Digits(as_image=True)
    assert data.tensors[0].shape[1:] == (1, 8, 8)
    assert data[0][0].shape == (1, 8, 8)


def test_split_is_stratified_and_seeded() -> None:
    train, test = Digits().targets, Digits(split="test").targets
    train_share = np.bincount(train, minlength=10) / len(train)
    test_share = np.bincount(test, minlength=10) / len(test)
    np.testing.assert_allclose(train_share, test_share, atol=0.01)
    assert Digits().num_classes == 10
    assert not np.array_equal(Digits(seed=1).targets, train)
    np.testing.assert_array_equal(Digits(seed=0).targets, train)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"split": "val"}, r"split must be one of \['train', 'test'\], got 'val'"),
        ({"test_fraction": 1.0}, r"test_fraction must be in \(0, 1\), got 1.0"),
    ],
)
def test_bad_arguments(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Digits(**kwargs)
