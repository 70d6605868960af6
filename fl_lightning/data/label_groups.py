"""Label groups: consecutive groups of clients, each holding its own labels.

The FedStaleWeight experiments (Ma et al., §6.2) tie data to compute speed: the 10 fast agents
hold labels 4-9, the 5 slow agents labels 0-3, each label split IID among its group. With
:class:`~fl_lightning.participation.DelayGroups` over the same ``sizes``, group ``g`` of the
partition is group ``g`` of the speed model.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from typing_extensions import override

from fl_lightning.data._data_checks import check_int
from fl_lightning.data.partitioners import Partitioner, _split_labels


class LabelGroups(Partitioner):
    """Client group ``g`` (``sizes[g]`` consecutive clients) holds the labels ``labels[g]``.

    Each label's samples are shuffled and split among the clients of the groups that list it,
    in shares that differ by at most one sample, so within a group the label is IID across
    clients and no two clients share a sample; this is afl-bench's ``restricted_subpopulation``
    split. A label listed by several groups is split over all their clients; samples whose label
    no group lists are left out.

    Args:
        sizes: Clients per group, in client order; they must sum to ``num_clients``.
        labels: The labels of each group (one non-empty list per group).

    Example::

        # the paper's split: clients 0-9 (fast) hold labels 4-9, clients 10-14 (slow) labels 0-3
        LabelGroups(sizes=[10, 5], labels=[[4, 5, 6, 7, 8, 9], [0, 1, 2, 3]])
    """

    def __init__(self, sizes: Sequence[int], labels: Sequence[Sequence[int]]) -> None:
        if not sizes or len(sizes) != len(labels):
            raise ValueError(f"LabelGroups needs one label list per group size, got {len(sizes)} sizes and {len(labels)} label lists.")
        self.sizes = [check_int(f"sizes[{g}]", s, minimum=1) for g, s in enumerate(sizes)]
        self.labels = [[check_int(f"labels[{g}]", label, minimum=0) for label in group] for g, group in enumerate(labels)]
        for g, group in enumerate(self.labels):
            if not group:
                raise ValueError(f"LabelGroups: group {g} has no labels.")
            if len(set(group)) != len(group):
                raise ValueError(f"LabelGroups: group {g} lists a label twice: {group}.")

    @override
    def _partition(
        self, targets: np.ndarray | None, num_samples: int, num_clients: int, rng: np.random.Generator
    ) -> list[np.ndarray]:
        assert targets is not None
        if sum(self.sizes) != num_clients:
            raise ValueError(f"LabelGroups sizes {self.sizes} sum to {sum(self.sizes)}, not num_clients={num_clients}.")
        present = set(np.unique(targets).tolist())
        missing = sorted({label for group in self.labels for label in group} - present)
        if missing:
            raise ValueError(f"LabelGroups: labels {missing} do not occur in the dataset.")
        client_labels = [np.asarray(group) for group, size in zip(self.labels, self.sizes) for _ in range(size)]
        return _split_labels(targets, client_labels, np.ones(num_clients), rng)
