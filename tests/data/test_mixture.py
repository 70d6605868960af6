"""Source mixtures of FedSoft's experiments: patterns, counts, synthetic regression, rotated images."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fl_lightning.data import (
    Digits,
    FederatedDataModule,
    Natural,
    RotatedMixture,
    SyntheticRegressionMixture,
)
from fl_lightning.data.datasets.mixture import mixture_counts, mixture_proportions


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


@pytest.mark.parametrize(("pattern", "minor"), [("10:90", 0.1), ("30:70", 0.3)])
def test_ratio_patterns_give_exact_group_counts(pattern, minor):
    data = SyntheticRegressionMixture(num_clients=100, pattern=pattern, seed=1)
    sizes = data.counts.sum(axis=1)
    assert sizes.min() >= 100 and sizes.max() <= 200
    first = np.floor(np.where(np.arange(100) < 50, 1 - minor, minor) * sizes + 1e-9).astype(int)
    assert np.array_equal(data.counts[:, 0], first)  # the authors' int(frac * n_k)
    assert np.array_equal(data.counts[:, 1], sizes - first)


def test_linear_and_random_patterns():
    linear = mixture_proportions("linear", 100, 2, rng())
    np.testing.assert_allclose(linear[:, 0], (0.5 + np.arange(100)) / 100)
    np.testing.assert_allclose(linear.sum(axis=1), 1.0)
    random = mixture_proportions("random", 50, 4, rng())
    np.testing.assert_allclose(random.sum(axis=1), 1.0)
    assert (random > 0).all() and len({tuple(r) for r in random.round(6)}) == 50


def test_ratio_pattern_for_more_sources_spreads_the_minor_share():
    props = mixture_proportions("10:90", 6, 3, rng())
    np.testing.assert_allclose(props[0], [0.9, 0.05, 0.05])
    np.testing.assert_allclose(props[5], [0.05, 0.05, 0.9])


def test_counts_sum_to_the_client_sizes():
    props = mixture_proportions("random", 20, 3, rng())
    sizes = rng(1).integers(100, 201, 20)
    counts = mixture_counts(props, sizes)
    assert np.array_equal(counts.sum(axis=1), sizes) and (counts >= 0).all()


@pytest.mark.parametrize(
    ("pattern", "sources", "match"),
    [("linear", 3, "'linear' pattern needs num_sources=2"), ("10:80", 2, "a \\+ b = 100"), ("half", 2, "`pattern` must be")],
)
def test_bad_patterns(pattern, sources, match):
    with pytest.raises(ValueError, match=match):
        mixture_proportions(pattern, 10, sources, rng())


def test_synthetic_regression_follows_its_sources():
    train = SyntheticRegressionMixture(num_clients=10, noise_std=0.0, seed=4)
    test = SyntheticRegressionMixture(num_clients=10, noise_std=0.0, seed=4, split="test", test_samples_per_source=50)
    assert torch.equal(train.thetas, test.thetas)
    for data in (train, test):
        x, y = data.tensors
        pred = (x * data.thetas[torch.from_numpy(data.source_ids)]).sum(dim=1, keepdim=True)
        torch.testing.assert_close(pred, y, rtol=1e-5, atol=1e-4)
    assert np.bincount(test.source_ids).tolist() == [50, 50] and (test.client_ids == -1).all()
    assert np.array_equal(np.bincount(train.client_ids), train.counts.sum(axis=1))
    # theta_var is a variance: the coefficients' spread matches it
    wide = SyntheticRegressionMixture(num_sources=200, num_clients=1, theta_var=10.0, seed=0)
    assert wide.thetas.var().item() == pytest.approx(10.0, rel=0.1)


def test_datamodule_with_natural_partition_and_holdout():
    data = FederatedDataModule(SyntheticRegressionMixture(num_clients=6, seed=0), partitioner=Natural(), num_clients=6, holdout_fraction=0.2)
    sizes = [data.client_num_samples(c) for c in range(6)]
    assert all(80 <= n <= 160 for n in sizes)


def test_rotated_mixture_rotates_counter_clockwise_and_keeps_labels():
    base = Digits(split="test", as_image=True)
    train = RotatedMixture(base, angles=(0, 90, 180), num_clients=6, pattern="random", samples_per_client=(20, 30), seed=0)
    assert train.num_sources == 3 and train.num_classes == 10
    assert np.array_equal(np.bincount(train.client_ids), train.counts.sum(axis=1))
    images, labels = base.tensors
    for i in range(0, len(train), 17):
        k = int(train.source_ids[i])
        matches = [j for j in range(len(base)) if torch.equal(torch.rot90(images[j], k, dims=(-2, -1)), train.tensors[0][i])]
        assert matches and all(int(labels[j]) == int(train.targets[i]) for j in matches)
    test = RotatedMixture(base, angles=(0, 90), split="test")
    assert len(test) == 2 * len(base) and torch.equal(test.tensors[0][len(base)], torch.rot90(images[0], 1, dims=(-2, -1)))
    # counter-clockwise: the top-right pixel moves to the top-left
    corner = torch.zeros(1, 1, 4, 4)
    corner[..., 0, 3] = 1
    assert torch.rot90(corner, 1, dims=(-2, -1))[0, 0, 0, 0] == 1


def test_rotated_mixture_samples_classes_evenly():
    base = Digits(split="train", as_image=True)
    train = RotatedMixture(base, num_clients=20, samples_per_client=200, seed=0)
    counts = np.bincount(train.targets, minlength=10)
    assert counts.min() > 0.8 * counts.mean()


def test_rotated_mixture_bad_input():
    with pytest.raises(ValueError, match="square images"):
        RotatedMixture(Digits(split="test"))
    with pytest.raises(ValueError, match="multiples of 90"):
        RotatedMixture(Digits(split="test", as_image=True), angles=(0, 45))
