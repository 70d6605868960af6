"""fl_lightning's partitioners against flwr-datasets' own output on the same data and seed.

``fixtures/flwr_partitions.json`` was written by flwr-datasets itself (``fixtures/flwr_partitions.py``, run
in a separate environment; flwr-datasets is not a dependency). Where fl_lightning runs flwr-datasets'
algorithm with the same RNG calls, every sample must land in the same partition (``owner``); for the
Dirichlet partitioner, whose samples are drawn in another order, the per-client statistics over 200 seeds
must agree.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fl_lightning.data import (
    IID,
    Dirichlet,
    ExponentialSizes,
    GroupedNatural,
    IdToSize,
    InnerDirichlet,
    LinearSizes,
    Partitioner,
    Pathological,
    Sizes,
    SquareSizes,
)

FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "flwr_partitions.json").read_text())
LABELS = np.asarray(FIXTURE["labels"])
NATURAL_IDS = np.asarray(FIXTURE["natural_ids"])


def ours(case: dict[str, Any]) -> tuple[Partitioner, int, int]:
    """Our partitioner for a flwr-datasets case, the number of clients and the seed of the data module's RNG."""
    name, args = case["partitioner"], case["args"]
    shuffle = {"shuffle": case["shuffle_seed"] is not None}
    seed = case["shuffle_seed"] if case["shuffle_seed"] is not None else args.get("seed", 0)
    if name == "IidPartitioner":
        assert shuffle["shuffle"], "our IID always shuffles"
        return IID(), args["num_partitions"], seed
    sizes = {"LinearPartitioner": LinearSizes, "SquarePartitioner": SquareSizes, "ExponentialPartitioner": ExponentialSizes}
    if name in sizes:
        return sizes[name](**shuffle), args["num_partitions"], seed
    if name == "SizePartitioner":
        return Sizes(args["partition_sizes"], **shuffle), len(args["partition_sizes"]), seed
    if name == "InnerDirichletPartitioner":
        return InnerDirichlet(alpha=args["alpha"], sizes=args["partition_sizes"]), len(args["partition_sizes"]), seed
    if name == "PathologicalPartitioner":
        partitioner = Pathological(args["num_classes_per_partition"], args["class_assignment_mode"])
        return partitioner, args["num_partitions"], seed
    if name == "GroupedNaturalIdPartitioner":
        partitioner = GroupedNatural(args["group_size"], args.get("mode", "allow-smaller"), sort_ids=args.get("sort_unique_ids", False))
        return partitioner, len(partitioner.groups(NATURAL_IDS)), seed
    raise AssertionError(name)


def owner(parts: list[np.ndarray], num_samples: int) -> str:
    """The fixture's encoding: each sample's client in base 36, ``-`` for none."""
    result = ["-"] * num_samples
    for cid, part in enumerate(parts):
        for index in part:
            result[index] = np.base_repr(cid, 36)
    return "".join(result)


EXACT = [case for case in FIXTURE["exact"] if case["partitioner"] != "IidPartitioner" or case["shuffle_seed"] is not None]


@pytest.mark.parametrize("case", EXACT, ids=lambda c: f"{c['partitioner']}-{json.dumps(c['args'])}-shuffle{c['shuffle_seed']}")
def test_partition_equals_flwr_datasets_id_for_id(case: dict[str, Any]) -> None:
    partitioner, num_clients, seed = ours(case)
    inputs = {"targets": LABELS, "client_ids": NATURAL_IDS, "none": None}[partitioner.needs]
    parts = partitioner(inputs, len(LABELS), num_clients, np.random.default_rng(seed))
    assert owner(parts, len(LABELS)) == case["owner"]


def test_the_fixture_covers_every_mode() -> None:
    names = {case["partitioner"] for case in FIXTURE["exact"]}
    assert names == {"IidPartitioner", "LinearPartitioner", "SquarePartitioner", "ExponentialPartitioner", "SizePartitioner",
                     "InnerDirichletPartitioner", "PathologicalPartitioner", "GroupedNaturalIdPartitioner"}  # fmt: skip
    modes = {c["args"].get("class_assignment_mode") for c in FIXTURE["exact"]} | {c["args"].get("mode") for c in FIXTURE["exact"]}
    assert modes >= {"random", "deterministic", "first-deterministic", "allow-smaller", "allow-bigger", "drop-reminder", "strict"}
    assert any(isinstance(c["args"].get("alpha"), list) for c in FIXTURE["exact"])  # a per-label alpha


@pytest.mark.parametrize("case", FIXTURE["dirichlet"]["cases"], ids=lambda c: json.dumps(c["args"]))
def test_dirichlet_statistics_equal_flwr_datasets(case: dict[str, Any]) -> None:
    # The fixture's labels: 2,000 samples, 10 balanced classes, shuffled.
    num_samples = FIXTURE["dirichlet"]["num_samples"]
    targets = np.random.default_rng(FIXTURE["dirichlet"]["labels_seed"]).permutation(np.arange(num_samples) % 10)
    args = case["args"]
    partitioner = Dirichlet(alpha=args["alpha"], min_samples=args["min_partition_size"], self_balancing=args["self_balancing"])
    sizes, labels = [], []
    for seed in range(case["seeds"]):
        parts = partitioner(targets, num_samples, args["num_partitions"], np.random.default_rng(10_000 + seed))
        sizes.append([len(p) for p in parts])
        labels.append([len(np.unique(targets[p])) for p in parts])
    for name, ours_ in (("sizes", np.asarray(sizes)), ("labels", np.asarray(labels))):
        flwr_mean, flwr_std = np.asarray(case[name]["mean"]), np.asarray(case[name]["std"])
        # Two independent means of `seeds` draws: their difference has standard error sqrt(2) * std / sqrt(seeds).
        error = np.sqrt(2 / case["seeds"]) * np.maximum(flwr_std, ours_.std(axis=0)) + 1e-9
        assert np.all(np.abs(ours_.mean(axis=0) - flwr_mean) <= 4.5 * error), (name, ours_.mean(axis=0), flwr_mean)
        # and the spreads agree to within 30 %
        assert np.allclose(ours_.std(axis=0), flwr_std, rtol=0.3, atol=0.15), (name, ours_.std(axis=0), flwr_std)


def test_dirichlet_alpha_vector_gives_shares_proportional_to_alpha() -> None:
    # Without balancing, client c's expected share of every class is alpha[c] / sum(alpha).
    targets = np.arange(5000) % 5
    alpha = [1.0, 2.0, 7.0]
    shares = [[len(p) / 5000 for p in Dirichlet(alpha=alpha, self_balancing=False)(targets, 5000, 3, np.random.default_rng(s))]
              for s in range(100)]  # fmt: skip
    np.testing.assert_allclose(np.mean(shares, axis=0), np.array(alpha) / sum(alpha), atol=0.03)


def test_id_to_size_takes_any_function_of_the_client_number() -> None:
    parts = IdToSize(np.sqrt, shuffle=False)(None, 100, 4, np.random.default_rng(0))
    weights = np.sqrt([1, 2, 3, 4])
    expected = np.floor(weights / weights.sum() * 100).astype(int)
    expected[-1] += 100 - expected.sum()
    assert [len(p) for p in parts] == expected.tolist()
    assert np.array_equal(np.concatenate(parts), np.arange(100))  # contiguous blocks in order without shuffle


def test_inner_dirichlet_default_sizes_split_evenly_and_labels_follow_alpha() -> None:
    targets = np.arange(600) % 3
    parts = InnerDirichlet(alpha=[100.0, 100.0, 0.01])(targets, 600, 4, np.random.default_rng(0))
    assert [len(p) for p in parts] == [150] * 4
    # Label 2 is nearly absent from every prior: it is drawn only once the others run out (there are none left over).
    counts = np.array([np.bincount(targets[p], minlength=3) for p in parts])
    assert counts[:, 2].sum() == 200 and counts.sum() == 600


def test_grouped_natural_groups_and_errors() -> None:
    ids = np.array(["b", "a", "c", "a", "d", "e", "b"])
    assert [g.tolist() for g in GroupedNatural(2).groups(ids)] == [["b", "a"], ["c", "d"], ["e"]]
    assert [g.tolist() for g in GroupedNatural(2, "allow-bigger").groups(ids)] == [["b", "a", "c"], ["d", "e"]]
    assert [g.tolist() for g in GroupedNatural(2, "drop-reminder", sort_ids=True).groups(ids)] == [["a", "b"], ["c", "d"]]
    parts = GroupedNatural(2)(ids, 7, 3, np.random.default_rng(0))
    assert [p.tolist() for p in parts] == [[0, 1, 3, 6], [2, 4], [5]]
    with pytest.raises(ValueError, match=r"makes 3 groups of client ids but num_clients=2; set num_clients=3"):
        GroupedNatural(2)(ids, 7, 2, np.random.default_rng(0))
    with pytest.raises(ValueError, match=r"5 distinct client ids are not a multiple of group_size=2 \(1 left over\)"):
        GroupedNatural(2, "strict").groups(ids)
    with pytest.raises(ValueError, match=r"group_size=6 exceeds the 5 distinct client ids"):
        GroupedNatural(6, "strict").groups(ids)


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: Dirichlet(alpha=[1.0, 0.0]), r"`alpha` must be finite numbers > 0, got \[1.0, 0.0\]"),
        (lambda: Dirichlet(alpha=[]), r"alpha must be a number > 0 or a non-empty list of them, got \[\]"),
        (lambda: Dirichlet(alpha=0.5, self_balancing="yes"), r"self_balancing must be a bool \(true or false\), got 'yes'"),
        (lambda: Sizes([10, 0]), r"sizes\[1\] must be an int >= 1, got 0"),
        (lambda: Sizes([]), r"sizes must be a non-empty list of client sizes, got \[\]"),
        (lambda: IdToSize("square"), r"size_fn must be a function of the client numbers 1..num_clients, got 'square'"),
        (lambda: InnerDirichlet(alpha=-1), r"`alpha` must be a finite number > 0, got -1"),
        (lambda: InnerDirichlet(alpha=1.0, sizes=[3, -1]), r"sizes\[1\] must be an int >= 1, got -1"),
        (lambda: Pathological(0), r"k must be an int >= 1, got 0"),
        (lambda: Pathological(2, "first"), r"assignment must be one of \['random', 'deterministic', 'first-deterministic'\], got 'first'"),
        (lambda: GroupedNatural(0), r"group_size must be an int >= 1, got 0"),
        (lambda: GroupedNatural(2, "drop-remainder"), r"mode must be one of .*'drop-reminder', 'strict'\], got 'drop-remainder'"),
    ],
)
def test_bad_constructor_arguments(make, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        make()


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: Dirichlet(alpha=[1.0, 2.0])(LABELS, 160, 3, np.random.default_rng(0)),
         r"alpha has 2 values but there are 3 clients \(num_clients\); give one per client"),
        (lambda: InnerDirichlet(alpha=[1.0, 2.0])(LABELS, 160, 3, np.random.default_rng(0)),
         r"alpha has 2 values but there are 6 labels; give one per label"),
        (lambda: Sizes([10, 20])(None, 160, 3, np.random.default_rng(0)), r"gives 2 client sizes but num_clients=3"),
        (lambda: Sizes([100, 70])(None, 160, 2, np.random.default_rng(0)), r"the sizes sum to 170, more than the 160 samples"),
        (lambda: ExponentialSizes()(None, 160, 12, np.random.default_rng(0)), r"gives client 0 no sample \(160 samples, 12 clients\)"),
        (lambda: Pathological(7)(LABELS, 160, 3, np.random.default_rng(0)), r"7 labels per client requested but the dataset has only 6"),
        (lambda: Pathological(1, "deterministic")(np.array([0, 1, 1, 1]), 4, 4, np.random.default_rng(0)),
         r"label 0 has 1 samples but 2 clients hold it"),
    ],
)  # fmt: skip
def test_bad_partitions_name_the_value(call, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        call()
