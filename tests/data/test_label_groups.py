"""LabelGroups: the FedStaleWeight paper's label/speed split (fast clients 4-9, slow clients 0-3)."""

import numpy as np
import pytest
import torch

from fl_lightning.data import FederatedDataModule, InMemoryDataset, LabelGroups

# 10 balanced labels, 60 samples each, shuffled so that label order carries no information.
TARGETS = np.random.default_rng(5).permutation(np.repeat(np.arange(10), 60))
PAPER = LabelGroups(sizes=[10, 5], labels=[[4, 5, 6, 7, 8, 9], [0, 1, 2, 3]])


def split(partitioner: LabelGroups, num_clients: int = 15, seed: int = 0) -> list[np.ndarray]:
    return partitioner(TARGETS, len(TARGETS), num_clients, np.random.default_rng(seed))


def test_the_papers_split_gives_each_group_its_labels_only() -> None:
    parts = split(PAPER)
    assert [sorted(set(TARGETS[p].tolist())) for p in parts] == [[4, 5, 6, 7, 8, 9]] * 10 + [[0, 1, 2, 3]] * 5
    merged = np.concatenate(parts)
    np.testing.assert_array_equal(np.sort(merged), np.arange(len(TARGETS)))  # disjoint and covering


def test_each_label_is_split_evenly_within_its_group() -> None:
    parts = split(PAPER)
    for label, clients in ((4, range(10)), (9, range(10)), (0, range(10, 15)), (3, range(10, 15))):
        counts = [int((TARGETS[parts[c]] == label).sum()) for c in clients]
        assert sum(counts) == 60 and max(counts) - min(counts) <= 1


def test_deterministic_from_the_rng_and_seed_dependent() -> None:
    for a, b in zip(split(PAPER, seed=3), split(PAPER, seed=3), strict=True):
        np.testing.assert_array_equal(a, b)
    assert any(not np.array_equal(a, b) for a, b in zip(split(PAPER, seed=3), split(PAPER, seed=4), strict=True))


def test_unlisted_labels_are_left_out_and_a_shared_label_spans_its_groups() -> None:
    parts = split(LabelGroups(sizes=[2, 2], labels=[[0, 1], [1, 2]]), num_clients=4)
    held = np.concatenate(parts)
    assert set(TARGETS[held].tolist()) == {0, 1, 2} and len(held) == 180
    assert [int((TARGETS[p] == 1).sum()) for p in parts] == [15, 15, 15, 15]


def test_through_the_datamodule() -> None:
    dataset = InMemoryDataset(inputs=torch.zeros(len(TARGETS), 2), labels=torch.as_tensor(TARGETS), num_classes=10)
    data = FederatedDataModule(dataset, partitioner=PAPER, num_clients=15, batch_size=4)
    data.setup("fit")
    assert [data.client_num_samples(c) for c in (0, 14)] == [36, 48]  # 6 labels x 60 / 10; 4 x 60 / 5
    assert np.flatnonzero(data.label_counts(14)).tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: LabelGroups(sizes=[10, 5], labels=[[4, 5]]), "one label list per group size, got 2 sizes and 1"),
        (lambda: LabelGroups(sizes=[], labels=[]), "one label list per group size"),
        (lambda: LabelGroups(sizes=[0], labels=[[1]]), r"sizes\[0\] must be an int >= 1, got 0"),
        (lambda: LabelGroups(sizes=[2], labels=[[]]), "group 0 has no labels"),
        (lambda: LabelGroups(sizes=[2], labels=[[1, 1]]), "group 0 lists a label twice"),
        (lambda: LabelGroups(sizes=[2], labels=[[-1]]), r"labels\[0\] must be an int >= 0, got -1"),
    ],
)
def test_bad_constructor_arguments(make, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        make()


def test_sizes_must_match_the_clients_and_labels_must_exist() -> None:
    with pytest.raises(ValueError, match=r"sizes \[10, 5\] sum to 15, not num_clients=12"):
        split(PAPER, num_clients=12)
    with pytest.raises(ValueError, match=r"labels \[10\] do not occur in the dataset"):
        split(LabelGroups(sizes=[15], labels=[[9, 10]]))
