import numpy as np
import pytest

from fl_lightning.data import (
    IID,
    Dirichlet,
    GroupedNatural,
    InnerDirichlet,
    LabelsPerClient,
    LinearSizes,
    Natural,
    ParetoSizes,
    Partitioner,
    Pathological,
    Shards,
    Sizes,
    SquareSizes,
)
from fl_lightning.data.partitioners import group_rows

NUM_SAMPLES = 1000
NUM_CLIENTS = 10
# Balanced labels, 100 per class, shuffled so that label order carries no information.
TARGETS = np.random.default_rng(123).permutation(np.repeat(np.arange(10), 100))
# Ten natural clients with non-contiguous ids 5, 8, ..., 32 and sizes 10, 30, ..., 190.
CLIENT_IDS = np.random.default_rng(7).permutation(np.repeat(np.arange(10) * 3 + 5, np.arange(10, 200, 20)))

# With these settings every partitioner covers the whole dataset.
PARTITIONERS = [
    IID(),
    Dirichlet(alpha=0.5),
    Shards(shards_per_client=2),
    LabelsPerClient(3),
    LabelsPerClient(3, assignment="balanced"),
    ParetoSizes(),
    ParetoSizes(labels_per_client=1),
    Natural(),
    Dirichlet(alpha=[0.5] * 5 + [2.0] * 5, self_balancing=False),
    Sizes([100] * 10),
    LinearSizes(),
    SquareSizes(),
    InnerDirichlet(alpha=0.5),
    Pathological(2, "deterministic"),
    GroupedNatural(1),
]
# Those whose partition depends on the seed (a deterministic label assignment still splits in dataset order).
RANDOM = [p for p in PARTITIONERS if not isinstance(p, (Natural, GroupedNatural, Pathological))]


def partition(partitioner: Partitioner, seed: int = 0, num_clients: int = NUM_CLIENTS) -> list[np.ndarray]:
    inputs = {"targets": TARGETS, "client_ids": CLIENT_IDS, "none": None}[partitioner.needs]
    return partitioner(inputs, NUM_SAMPLES, num_clients, np.random.default_rng(seed))


def labels_per_client(parts: list[np.ndarray]) -> np.ndarray:
    return np.array([len(np.unique(TARGETS[part])) for part in parts])


@pytest.mark.parametrize("partitioner", PARTITIONERS, ids=repr)
def test_partition_is_disjoint_sorted_and_covering(partitioner: Partitioner) -> None:
    parts = partition(partitioner)
    assert len(parts) == NUM_CLIENTS
    assert all(part.dtype == np.int64 and len(part) > 0 for part in parts)
    assert all(np.all(np.diff(part) > 0) for part in parts)
    merged = np.concatenate(parts)
    assert len(np.unique(merged)) == len(merged)
    np.testing.assert_array_equal(np.sort(merged), np.arange(NUM_SAMPLES))


@pytest.mark.parametrize("partitioner", PARTITIONERS, ids=repr)
def test_partition_is_deterministic(partitioner: Partitioner) -> None:
    for first, second in zip(partition(partitioner, seed=3), partition(partitioner, seed=3), strict=True):
        np.testing.assert_array_equal(first, second)


@pytest.mark.parametrize("partitioner", RANDOM, ids=repr)
def test_partition_depends_on_seed(partitioner: Partitioner) -> None:
    first, second = partition(partitioner, seed=3), partition(partitioner, seed=4)
    assert any(not np.array_equal(a, b) for a, b in zip(first, second, strict=True))


def test_iid_sizes_are_balanced() -> None:
    sizes = [len(part) for part in IID()(None, 1003, 10, np.random.default_rng(0))]
    assert max(sizes) - min(sizes) <= 1 and sum(sizes) == 1003


def test_dirichlet_small_alpha_is_more_skewed() -> None:
    skewed = labels_per_client(partition(Dirichlet(alpha=0.1))).mean()
    uniform = labels_per_client(partition(Dirichlet(alpha=100.0))).mean()
    assert skewed < 5 < uniform == 10


def test_dirichlet_min_samples() -> None:
    parts = partition(Dirichlet(alpha=0.3, min_samples=40))
    assert min(len(part) for part in parts) >= 40


def test_shards_give_at_most_shards_per_client_labels() -> None:
    # 100 samples per class and shards of 50: shards never straddle two labels.
    parts = partition(Shards(shards_per_client=2))
    assert labels_per_client(parts).max() <= 2
    assert {len(part) for part in parts} == {100}


def test_labels_per_client_gives_exactly_k_labels_and_uses_all() -> None:
    parts = partition(LabelsPerClient(3))
    assert set(labels_per_client(parts)) == {3}
    assert len(np.unique(TARGETS[np.concatenate(parts)])) == 10


def test_labels_per_client_splits_each_label_evenly() -> None:
    # 10 clients * 2 labels = 20 slots over 10 labels: each label held by 2 clients, 50 samples each.
    parts = partition(LabelsPerClient(2))
    assert {len(part) for part in parts} == {100}


def test_balanced_label_assignment_is_fedmrns_deterministic_greedy_rule() -> None:
    # Notes §4.2: client i takes argsort(times / (i + 1))[:k], the k least-held labels so far.
    parts = [partition(LabelsPerClient(3, assignment="balanced"), seed=s) for s in (0, 1)]
    held = [[sorted(np.unique(TARGETS[p]).tolist()) for p in ps] for ps in parts]
    assert held[0] == held[1]  # the label sets do not depend on the seed (the samples do)
    assert held[0][:4] == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [0, 1, 9]]
    holders = np.bincount(np.concatenate([np.unique(TARGETS[p]) for p in parts[0]]), minlength=10)
    assert holders.tolist() == [3] * 10  # 30 slots over 10 labels, balanced


def test_labels_per_client_drops_unheld_labels() -> None:
    parts = partition(LabelsPerClient(1), num_clients=4)
    assert len(np.unique(TARGETS[np.concatenate(parts)])) == 4
    assert sum(len(part) for part in parts) == 400


def test_pareto_sizes_are_heavy_tailed_and_sum_to_n() -> None:
    targets = np.zeros(10_000, dtype=np.int64)
    sizes = np.array([len(p) for p in ParetoSizes()(targets, 10_000, 100, np.random.default_rng(0))])
    assert sizes.sum() == 10_000 and sizes.min() >= 1
    assert sizes.max() / np.median(sizes) > 10


def test_pareto_sizes_with_one_label_per_client() -> None:
    # Five clients per label share its 100 samples in proportion to their Pareto weights.
    parts = partition(ParetoSizes(labels_per_client=1), num_clients=50)
    assert set(labels_per_client(parts)) == {1}
    sizes = np.array([len(part) for part in parts])
    assert sizes.sum() == NUM_SAMPLES and sizes.max() > 3 * np.median(sizes)


def test_natural_matches_client_ids() -> None:
    parts = partition(Natural())
    for cid, part in enumerate(parts):
        assert set(CLIENT_IDS[part]) == {np.unique(CLIENT_IDS)[cid]}
        assert len(part) == np.sum(CLIENT_IDS == np.unique(CLIENT_IDS)[cid])


def test_repr_names_arguments() -> None:
    assert repr(Dirichlet(alpha=0.5)) == "Dirichlet(alpha=0.5, min_samples=1, self_balancing=True)"
    assert repr(ParetoSizes()) == "ParetoSizes(shape=1.16, labels_per_client=None)"


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: Dirichlet(alpha=0.0), r"`alpha` must be a finite number > 0, got 0.0"),
        (lambda: Dirichlet(alpha=-1), r"`alpha` must be a finite number > 0, got -1"),
        (lambda: Dirichlet(alpha=1.0, min_samples=0), r"min_samples must be an int >= 1, got 0"),
        (lambda: Shards(shards_per_client=0), r"shards_per_client must be an int >= 1, got 0"),
        (lambda: LabelsPerClient(0), r"k must be an int >= 1, got 0"),
        (lambda: LabelsPerClient(2, assignment="greedy"), r"`assignment` must be 'shuffled' or 'balanced', got 'greedy'"),
        (lambda: ParetoSizes(shape=0), r"`shape` must be a finite number > 0, got 0"),
        (lambda: ParetoSizes(labels_per_client=0), r"labels_per_client must be an int >= 1, got 0"),
    ],
)
def test_bad_constructor_arguments(make, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        make()


@pytest.mark.parametrize("partitioner", PARTITIONERS, ids=repr)
def test_more_clients_than_samples(partitioner: Partitioner) -> None:
    with pytest.raises(ValueError, match=r"num_clients=1001 exceeds num_samples=1000"):
        partition(partitioner, num_clients=1001)


def test_more_shards_than_samples() -> None:
    with pytest.raises(ValueError, match=r"10 \* 2 = 20 shards but there are only 15 samples"):
        Shards(shards_per_client=2)(np.zeros(15, dtype=np.int64), 15, 10, np.random.default_rng(0))


def test_dirichlet_gives_up_with_a_clear_error() -> None:
    targets = np.repeat(np.arange(2), 10)
    with pytest.raises(ValueError, match=r"fewer than min_samples=2 samples in 1000 draws; use fewer clients"):
        Dirichlet(alpha=0.01, min_samples=2)(targets, 20, 10, np.random.default_rng(0))


def test_dirichlet_min_samples_beyond_dataset() -> None:
    with pytest.raises(ValueError, match=r"min_samples=200 for 10 clients needs 2000 samples, but there are 1000"):
        partition(Dirichlet(alpha=1.0, min_samples=200))


def test_label_with_fewer_samples_than_holders() -> None:
    # Labels 0 and 1 are each dealt to two of the four clients, but label 1 has a single sample.
    targets = np.array([0, 0, 0, 1])
    with pytest.raises(ValueError, match=r"label 1 has 1 samples but 2 clients hold it; use fewer clients"):
        LabelsPerClient(1)(targets, 4, 4, np.random.default_rng(0))


def test_custom_partitioner_leaving_a_client_empty() -> None:
    class FirstClientTakesAll(Partitioner):
        needs = "none"

        def _partition(self, targets, num_samples, num_clients, rng):
            return [np.arange(num_samples)] + [np.empty(0, dtype=np.int64)] * (num_clients - 1)

    with pytest.raises(ValueError, match=r"left client 1 empty \(5 samples, 3 clients\); use fewer clients"):
        FirstClientTakesAll()(None, 5, 3, np.random.default_rng(0))


def test_labels_per_client_more_than_labels() -> None:
    with pytest.raises(ValueError, match=r"11 labels per client requested but the dataset has only 10 labels"):
        partition(LabelsPerClient(11))


def test_natural_client_count_mismatch() -> None:
    with pytest.raises(ValueError, match=r"10 distinct client ids but num_clients=5; set num_clients=10"):
        partition(Natural(), num_clients=5)


def test_missing_targets() -> None:
    with pytest.raises(ValueError, match=r"Shards\(shards_per_client=2\) needs targets, got None"):
        Shards()(None, 10, 2, np.random.default_rng(0))


def test_targets_of_wrong_length() -> None:
    with pytest.raises(ValueError, match=r"targets must have shape \(10,\), got \(9,\)"):
        Shards()(np.zeros(9), 10, 2, np.random.default_rng(0))


def test_group_rows_matches_a_dictionary_grouping():
    users = np.array(["b", "a", "c", "a", "b", "b"], dtype=object)
    ids, order, offsets = group_rows(users)
    expected: dict[str, list[int]] = {}
    for row, user in enumerate(users):
        expected.setdefault(user, []).append(row)
    assert list(ids) == sorted(expected)
    assert [order[offsets[c] : offsets[c + 1]].tolist() for c in range(len(ids))] == [expected[u] for u in ids]
    ids, order, offsets = group_rows(np.array([10, 2, 10]))  # numbers sort as numbers
    assert ids.tolist() == [2, 10] and offsets.tolist() == [0, 1, 3] and order.tolist() == [1, 0, 2]
