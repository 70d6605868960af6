"""PrioritizedSynthetic: FedALIGN's synthetic federation (our reconstruction of the noise)."""

import numpy as np
import pytest
import torch

from fl_lightning import FedALIGN, FederatedTrainer
from fl_lightning.data import FederatedDataModule, Natural, PrioritizedSynthetic
from fl_lightning.data.datasets.prioritized_synthetic import skewed_noise_levels
from fl_lightning.models import LogisticRegression

SMALL = {"num_priority": 3, "num_clean": 2, "num_noisy": 5, "priority_samples": 20, "nonpriority_samples": 60, "test_samples": 300}


def make(**kwargs) -> PrioritizedSynthetic:
    return PrioritizedSynthetic(**{**SMALL, **kwargs})


def client(data: PrioritizedSynthetic, c: int) -> np.ndarray:
    return data.client_ids == c


def test_shapes_and_attributes() -> None:
    data = make()
    x, y = data.tensors
    assert x.shape == (3 * 20 + 7 * 60, 60) and x.dtype == torch.float32
    assert y.shape == (len(x),) and y.dtype == torch.int64 and data.targets.dtype == np.int64
    assert data.num_classes == 10
    np.testing.assert_array_equal(np.bincount(data.client_ids), [20] * 3 + [60] * 7)
    assert (data.priority_clients, data.clean_clients, data.noisy_clients) == ([0, 1, 2], [3, 4], [5, 6, 7, 8, 9])
    assert data.flip_fractions.shape == data.random_fractions.shape == (10,)
    assert data.flipped.shape == data.irrelevant.shape == (len(x),)


def test_default_sizes_are_the_fedprox_generators() -> None:
    data = PrioritizedSynthetic(max_samples_per_client=300)
    sizes = np.bincount(data.client_ids)
    assert len(sizes) == 20 and sizes.min() >= 50 and sizes.max() <= 300
    assert len(PrioritizedSynthetic(max_samples_per_client=300, split="test")) == 1000


def test_deterministic_from_seed() -> None:
    torch.testing.assert_close(make(seed=3).tensors, make(seed=3).tensors)
    np.testing.assert_array_equal(make(seed=3).flipped, make(seed=3).flipped)
    assert not torch.equal(make(seed=4).tensors[0], make(seed=3).tensors[0])


def test_noise_levels_follow_the_reconstruction() -> None:
    np.testing.assert_allclose(skewed_noise_levels(5, 1.5), (np.arange(1, 6) / 5) ** (1 / 1.5))
    data = make(label_noise=0.8, label_noise_skew=0.5, random_fraction=0.6, random_fraction_skew=5.0)
    np.testing.assert_allclose(data.flip_fractions, np.r_[np.zeros(5), 0.8 * skewed_noise_levels(5, 0.5)])
    np.testing.assert_allclose(data.random_fractions, np.r_[np.zeros(5), 0.6 * skewed_noise_levels(5, 5.0)])
    for c in range(10):  # exact counts: within one sample of the target fractions
        mask = client(data, c)
        relevant = mask & ~data.irrelevant
        assert abs(data.irrelevant[mask].sum() - data.random_fractions[c] * mask.sum()) <= 0.5
        assert abs(data.flipped[relevant].sum() - data.flip_fractions[c] * relevant.sum()) <= 0.5
        assert not (data.flipped & data.irrelevant).any()


def test_noise_from_zero_leaves_the_first_noisy_client_clean() -> None:
    np.testing.assert_allclose(skewed_noise_levels(5, 1.5, start="zero"), [0.0, *((np.arange(1, 5) / 4) ** (1 / 1.5))])
    np.testing.assert_allclose(skewed_noise_levels(1, 1.5, start="zero"), [0.0])
    data = make(noise_start="zero", label_noise=2.5)  # the paper's label noise factor
    first, last = data.noisy_clients[0], data.noisy_clients[-1]
    assert data.flip_fractions[first] == data.random_fractions[first] == 0.0
    assert not (data.flipped | data.irrelevant)[client(data, first)].any()
    assert data.random_fractions[last] == 1.0 and data.irrelevant[client(data, last)].all()
    # The same samples underneath: only the corruption differs from start="one".
    torch.testing.assert_close(data.tensors[0][client(data, 0)], make(label_noise=2.5).tensors[0][client(data, 0)])


def test_noise_grows_with_the_client_index() -> None:
    data = make()
    noisy = data.noisy_clients
    for fractions in (data.flip_fractions[noisy], data.random_fractions[noisy]):
        assert np.all(np.diff(fractions) > 0)
    measured = [data.irrelevant[client(data, c)].mean() for c in noisy]
    assert measured == sorted(measured) and measured[-1] == 1.0  # r_max = 1: the last client is all noise


@pytest.mark.parametrize("form", ["label_noise_skew", "random_fraction_skew"])
def test_noise_grows_with_the_skew_and_is_nested(form: str) -> None:
    low, mid, high = (make(**{form: skew}) for skew in (0.5, 1.5, 5.0))
    attribute, mask = ("flip_fractions", "flipped") if form == "label_noise_skew" else ("random_fractions", "irrelevant")
    noisy = low.noisy_clients[:-1]  # the last client sits at the maximum whatever the skew
    assert np.all(getattr(low, attribute)[noisy] < getattr(mid, attribute)[noisy])
    assert np.all(getattr(mid, attribute)[noisy] < getattr(high, attribute)[noisy])
    # The same draws whatever the noise: a higher level corrupts a superset of the points.
    assert np.all(getattr(low, mask) <= getattr(mid, mask)) and np.all(getattr(mid, mask) <= getattr(high, mask))
    assert getattr(low, mask).sum() < getattr(high, mask).sum()


def test_noise_only_corrupts_the_noisy_clients() -> None:
    clean = make(label_noise=0.0, random_fraction=0.0)
    noisy = make(label_noise=1.0, random_fraction=0.5)
    assert not clean.flipped.any() and not clean.irrelevant.any()
    x0, y0 = clean.tensors
    x1, y1 = noisy.tensors
    untouched = np.isin(noisy.client_ids, noisy.priority_clients + noisy.clean_clients)
    assert not (noisy.flipped | noisy.irrelevant)[untouched].any()
    assert torch.equal(x0[untouched], x1[untouched]) and torch.equal(y0[untouched], y1[untouched])
    kept = ~noisy.flipped & ~noisy.irrelevant
    assert torch.equal(x0[kept], x1[kept]) and torch.equal(y0[kept], y1[kept])
    flipped, irrelevant = torch.from_numpy(noisy.flipped), torch.from_numpy(noisy.irrelevant)
    assert flipped.any() and bool((y1[flipped] != y0[flipped]).all())  # a flip always changes the label
    assert torch.equal(x0[flipped], x1[flipped])
    assert irrelevant.any() and not bool((x1[irrelevant] == x0[irrelevant]).all(dim=1).any())


def test_label_noise_above_one_saturates() -> None:
    data = make(label_noise=2.5, label_noise_skew=1.5)
    levels = 2.5 * skewed_noise_levels(5, 1.5)
    np.testing.assert_allclose(data.flip_fractions[data.noisy_clients], np.minimum(levels, 1.0))
    assert data.flip_fractions.max() == 1.0


def label_distribution(labels: np.ndarray) -> np.ndarray:
    return np.bincount(labels, minlength=10) / len(labels)


def tv(a: np.ndarray, b: np.ndarray) -> float:
    """Total-variation distance between two distributions."""
    return float(0.5 * np.abs(a - b).sum())


def test_free_clients_draw_from_the_priority_mixture() -> None:
    data = make(num_priority=4, num_clean=4, num_noisy=0, priority_samples=[200, 100, 50, 50], nonpriority_samples=500, test_samples=2000)
    test = make(num_priority=4, num_clean=4, num_noisy=0, priority_samples=[200, 100, 50, 50], nonpriority_samples=500, test_samples=2000, split="test")
    pooled = label_distribution(data.targets[np.isin(data.client_ids, data.clean_clients)])
    priority = label_distribution(data.targets[np.isin(data.client_ids, data.priority_clients)])
    assert tv(pooled, label_distribution(test.targets)) < 0.05
    assert tv(pooled, priority) < 0.08
    first_device = label_distribution(data.targets[client(data, 0)])
    assert tv(first_device, priority) > 2 * tv(pooled, priority)  # a single device is skewed; the mixture is not


def test_test_split_is_clean_priority_data() -> None:
    quiet, loud = make(split="test", label_noise=0.0, random_fraction=0.0), make(split="test", label_noise=1.0, label_noise_skew=5.0)
    assert len(loud) == 300 and not loud.flipped.any() and not loud.irrelevant.any()
    torch.testing.assert_close(quiet.tensors, loud.tensors)  # the noise never reaches the test split
    np.testing.assert_array_equal(np.bincount(loud.client_ids, minlength=3), [100, 100, 100])  # p_k = 1/3 each
    train = make()
    joined = torch.cat([train.tensors[0], loud.tensors[0]])
    assert len(torch.unique(joined, dim=0)) == len(joined)


def test_test_split_follows_the_priority_weights() -> None:
    test = make(priority_samples=[10, 30, 60], split="test")
    np.testing.assert_array_equal(np.bincount(test.client_ids), [30, 90, 180])


def test_fedalign_reads_the_priority_set_from_the_training_set() -> None:
    data = FederatedDataModule(make(), make(split="test"), partitioner=Natural(), num_clients=10, batch_size=20)
    torch.manual_seed(0)
    trainer = FederatedTrainer(
        algorithm=FedALIGN(epsilon=0.2, warmup_fraction=0.0, evaluate_priority=True),
        max_epochs=2,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    trainer.fit(LogisticRegression(in_features=60, num_classes=10, lr=0.1), datamodule=data)
    assert trainer.algorithm.priority == [0, 1, 2]
    assert all(set(c) >= {0, 1, 2} for c in trainer.fit_loop.history)
    assert 0 <= float(trainer.callback_metrics["round/priority_test_acc"]) <= 1


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_priority": 0}, r"num_priority must be an int >= 1, got 0"),
        ({"num_noisy": -1}, r"num_noisy must be an int >= 0, got -1"),
        ({"label_noise": -0.1}, r"`label_noise` must be a finite number >= 0, got -0.1"),
        ({"random_fraction": float("nan")}, r"`random_fraction` must be a finite number >= 0"),
        ({"label_noise_skew": 0.0}, r"`skew` must be a finite number > 0, got 0.0"),
        ({"noise_start": 1}, r"start must be one of \['one', 'zero'\], got 1"),
        ({"split": "val"}, r"split must be one of \['train', 'test'\], got 'val'"),
        ({"test_samples": 0}, r"test_samples must be an int >= 1, got 0"),
        ({"priority_samples": [10, 10]}, r"priority_samples has 2 entries but there are 3 such clients"),
        ({"nonpriority_samples": 0}, r"nonpriority_samples must be an int >= 1, got 0"),
    ],
)
def test_bad_arguments(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        make(**kwargs)
