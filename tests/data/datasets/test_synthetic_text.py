"""SyntheticTopicText: seeded Markov-chain text whose writers mix topics differently (natural, non-IID clients)."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from fl_lightning.data import FederatedDataModule, Natural, SyntheticTopicText


def test_same_seed_same_text_and_the_splits_share_the_writers() -> None:
    train, again = SyntheticTopicText(num_clients=6), SyntheticTopicText(num_clients=6)
    test = SyntheticTopicText(num_clients=6, split="test")
    assert torch.equal(train.tensors[0], again.tensors[0]) and np.array_equal(train.client_ids, again.client_ids)
    assert not torch.equal(train.tensors[0][:5], SyntheticTopicText(num_clients=6, seed=1).tensors[0][:5])
    assert set(train.client_ids) == set(test.client_ids) == set(range(6))
    assert np.array_equal(train.mixtures, test.mixtures)
    tokens = train.tensors[0]
    assert tokens.dtype == torch.int64 and tokens.shape[1] == 32 and 0 <= tokens.min() and tokens.max() < 64
    # Each client's last 20 % (at least one) is its test share.
    sizes_train, sizes_test = np.bincount(train.client_ids), np.bincount(test.client_ids)
    assert np.array_equal(sizes_test, np.maximum(1, np.round(0.2 * (sizes_train + sizes_test))))


def test_topics_are_markov_chains_with_few_successors_and_a_low_oracle_perplexity() -> None:
    data = SyntheticTopicText(num_clients=5, num_topics=1, successors=2, vocab_size=16)
    tokens = data.tensors[0].numpy()
    successors = {a: set() for a in range(16)}
    for row in tokens:
        for a, b in zip(row[:-1], row[1:]):
            successors[int(a)].add(int(b))
    assert max(len(s) for s in successors.values()) <= 2
    assert 0 < data.oracle_nll <= np.log(2) + 1e-9  # at most the entropy of two successors


def test_natural_partition_gives_each_writer_its_own_skewed_topics() -> None:
    train = SyntheticTopicText()
    dm = FederatedDataModule(train, partitioner=Natural(), num_clients=39, val_fraction=0.1, seed=0)
    dm.setup("fit")
    assert dm.num_clients == 39
    for cid in range(39):
        assert set(train.client_ids[dm.client_indices(cid)]) == {cid}
    # Non-IID: with concentration 0.3 most writers' main topic dominates their text.
    shares = [np.bincount(train.targets[train.client_ids == c], minlength=4).max() / (train.client_ids == c).sum() for c in range(39)]
    assert np.mean(shares) > 0.6


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"successors": 65}, "`successors` must be at most vocab_size=64, got 65"),
        ({"topic_concentration": 0.0}, "`topic_concentration` must be a finite number > 0, got 0.0"),
        ({"test_fraction": 1.0}, "`test_fraction` must lie in (0, 1), got 1.0"),
        ({"sequences_per_client": [1, 5]}, "got [1, 5]"),
        ({"split": "val"}, "val"),
    ],
)
def test_bad_arguments_are_named(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        SyntheticTopicText(**kwargs)
