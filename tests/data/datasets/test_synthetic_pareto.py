"""FedProxSynthetic(sizes="pareto"): the flexible-participation paper's Type-I Pareto device sizes."""

from __future__ import annotations

import numpy as np
import pytest

from fl_lightning.data import FedProxSynthetic


def sizes(**kwargs) -> np.ndarray:
    train = FedProxSynthetic(num_clients=40, split="train", **kwargs)
    test = FedProxSynthetic(num_clients=40, split="test", **kwargs)
    return np.bincount(train.client_ids, minlength=40) + np.bincount(test.client_ids, minlength=40)


def test_pareto_sizes_split_the_pool_in_proportion_to_pareto_weights():
    got = sizes(sizes="pareto", pareto_index=0.5, total_samples=4000)
    assert got.sum() == 4000 and got.min() >= 2
    weights = np.random.default_rng([0, 1]).pareto(0.5, 40) + 1.0
    quotas = weights / weights.sum() * (4000 - 80) + 2
    assert np.all(np.abs(got - quotas) < 1.0 + 1e-9)  # largest remainder: within one sample of the quota
    # Heavy tail: the largest device holds far more than an equal share.
    assert got.max() > 10 * 4000 / 40


def test_the_floor_lifts_the_small_devices_and_keeps_the_total():
    got = sizes(sizes="pareto", pareto_index=0.5, total_samples=4000, min_samples_per_client=10)
    assert got.sum() == 4000 and got.min() == 10
    weights = np.random.default_rng([0, 1]).pareto(0.5, 40) + 1.0
    quotas = weights / weights.sum() * (4000 - 400) + 10
    assert np.all(np.abs(got - quotas) < 1.0 + 1e-9)


def test_size_law_does_not_change_the_devices_models():
    lognormal = FedProxSynthetic(num_clients=5, split="train", samples_per_client=20)
    pareto = FedProxSynthetic(num_clients=5, split="train", samples_per_client=20, sizes="pareto", total_samples=100)
    np.testing.assert_array_equal(lognormal.tensors[0].numpy(), pareto.tensors[0].numpy())


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"sizes": "zipf"}, "sizes"),
        ({"sizes": "pareto", "pareto_index": 0.0}, "pareto_index"),
        ({"sizes": "pareto", "total_samples": 10}, "total_samples"),
        ({"sizes": "pareto", "min_samples_per_client": 1}, "min_samples_per_client"),
        ({"sizes": "pareto", "total_samples": 399, "min_samples_per_client": 10}, "total_samples"),
    ],
)
def test_bad_pareto_arguments_are_rejected(kwargs, match):
    with pytest.raises(ValueError, match=match):
        FedProxSynthetic(num_clients=40, **kwargs)
