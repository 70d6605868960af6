import numpy as np
import pytest
import torch

from fl_lightning.data import FedProxSynthetic


def label_skew(dataset: FedProxSynthetic) -> float:
    """Mean total-variation distance between each device's label distribution and the pooled one."""
    pooled = np.bincount(dataset.targets, minlength=dataset.num_classes) / len(dataset)
    distances = []
    for k in np.unique(dataset.client_ids):
        local = np.bincount(dataset.targets[dataset.client_ids == k], minlength=dataset.num_classes)
        distances.append(0.5 * np.abs(local / local.sum() - pooled).sum())
    return float(np.mean(distances))


def feature_spread(dataset: FedProxSynthetic) -> float:
    """Standard deviation across devices of each device's mean feature value."""
    x = dataset.tensors[0].numpy()
    return float(np.std([x[dataset.client_ids == k].mean() for k in np.unique(dataset.client_ids)]))


def test_shapes_and_attributes() -> None:
    data = FedProxSynthetic(num_clients=5, samples_per_client=20)
    x, y = data.tensors
    assert x.shape == (90, 60) and x.dtype == torch.float32
    assert y.shape == (90,) and y.dtype == torch.int64
    assert data.targets.dtype == np.int64 and data.num_classes == 10
    np.testing.assert_array_equal(data.client_ids, np.repeat(np.arange(5), 18))
    sample_x, sample_y = data[3]
    assert sample_x.shape == (60,) and sample_y.ndim == 0


def test_reference_sizes_and_cap() -> None:
    sizes = np.bincount(FedProxSynthetic(num_clients=30).client_ids)
    assert sizes.min() >= int(0.9 * 50)
    capped = np.bincount(FedProxSynthetic(num_clients=30, max_samples_per_client=100).client_ids)
    assert capped.max() <= 90 and capped.min() >= 45


def test_deterministic_from_seed() -> None:
    first, second = FedProxSynthetic(seed=5), FedProxSynthetic(seed=5)
    torch.testing.assert_close(first.tensors, second.tensors)
    assert not torch.equal(FedProxSynthetic(seed=6).tensors[1][:40], first.tensors[1][:40])


def test_train_and_test_are_the_same_devices_split_90_10() -> None:
    train = FedProxSynthetic(num_clients=4, samples_per_client=[20, 50, 100, 30])
    test = FedProxSynthetic(num_clients=4, samples_per_client=[20, 50, 100, 30], split="test")
    np.testing.assert_array_equal(np.bincount(train.client_ids), [18, 45, 90, 27])
    np.testing.assert_array_equal(np.bincount(test.client_ids), [2, 5, 10, 3])
    # No sample appears in both splits.
    joined = torch.cat([train.tensors[0], test.tensors[0]])
    assert len(torch.unique(joined, dim=0)) == len(joined)


def test_labels_are_heterogeneous_across_devices() -> None:
    non_iid = FedProxSynthetic(num_clients=30, samples_per_client=200)
    iid = FedProxSynthetic(num_clients=30, samples_per_client=200, iid=True)
    assert label_skew(non_iid) > 0.5 > 0.2 > label_skew(iid)


def test_beta_controls_feature_heterogeneity() -> None:
    homogeneous = FedProxSynthetic(alpha=0.0, beta=0.0, num_clients=30, samples_per_client=200)
    heterogeneous = FedProxSynthetic(alpha=1.0, beta=1.0, num_clients=30, samples_per_client=200)
    assert feature_spread(heterogeneous) > 3 * feature_spread(homogeneous)


def test_alpha_shifts_every_logit_equally_so_the_data_is_unchanged() -> None:
    low = FedProxSynthetic(alpha=0.0, num_clients=10, samples_per_client=100)
    high = FedProxSynthetic(alpha=3.0, num_clients=10, samples_per_client=100)
    torch.testing.assert_close(low.tensors, high.tensors)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"alpha": -0.5}, r"`alpha` must be a finite number >= 0, got -0.5"),
        ({"beta": -1.0}, r"`beta` must be a finite number >= 0, got -1.0"),
        ({"split": "val"}, r"split must be one of \['train', 'test'\], got 'val'"),
        ({"num_clients": 0}, r"num_clients must be an int >= 1, got 0"),
        ({"samples_per_client": 1}, r"samples_per_client must be an int >= 2, got 1"),
        ({"samples_per_client": [10, 10]}, r"samples_per_client has 2 entries but num_clients=30"),
        ({"max_samples_per_client": 1}, r"max_samples_per_client must be an int >= 2, got 1"),
    ],
)
def test_bad_arguments(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        FedProxSynthetic(**kwargs)
