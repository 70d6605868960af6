"""Aggregations whose averaging of a group of decoded updates a robust rule may replace.

A robust aggregator (:mod:`fl_lightning.robust`) needs only one thing of the algorithm it wraps:
where that algorithm averages a group of updates (a round's deltas, FedMRN's decoded masks, the
members of one of FedSoft's centres), to use its own statistic instead, and then to let the
algorithm take its server step as usual. :class:`SupportsCombine` is that contract; a
weighted-sum algorithm (:class:`~fl_lightning.SummableAggregation`, or a wrapper of one) meets
it implicitly: the rule's result is the server step's delta of weight 1.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

from fl_lightning.algorithms.shared.algorithm import Algorithm, ClientUpdate
from fl_lightning.algorithms.shared.summable import SupportsWeightedSum, can_shard
from fl_lightning.server.model_state import State

#: A statistic of a group of payloads (every client counting once) that replaces their average.
Combine = Callable[[list[State]], State]


@runtime_checkable
class SupportsCombine(Protocol):
    """An algorithm that averages groups of decoded updates, each of which ``combine`` may replace."""

    @property
    def combinable(self) -> bool:
        """Whether :meth:`aggregate_with` is this algorithm's aggregation with ``combine`` in place of its averaging."""
        ...

    def combine_group(self) -> tuple[str, int]:
        """The setting that sizes a group, and its value: the updates in one group when every selected
        client reports (Krum's and Bulyan's ``n``)."""
        ...

    def aggregate_with(self, round_idx: int, global_state: State, updates: list[ClientUpdate], combine: Combine) -> dict[str, float]:
        """:meth:`~fl_lightning.Algorithm.aggregate`, with ``combine`` of each group's payloads in place of their average."""
        ...


def can_combine(algorithm: Algorithm) -> bool:
    """Whether a robust rule may replace ``algorithm``'s averaging (:func:`aggregate_with`)."""
    if isinstance(algorithm, SupportsCombine):
        return algorithm.combinable
    return can_shard(algorithm)


def combine_group(algorithm: Algorithm) -> tuple[str, int]:
    """:meth:`SupportsCombine.combine_group` of a set-up algorithm; a weighted sum's group is the round."""
    if isinstance(algorithm, SupportsCombine):
        return algorithm.combine_group()
    return "clients_per_round", algorithm.federation.clients_per_round


def apply_combined(
    algorithm: SupportsWeightedSum, round_idx: int, global_state: State, updates: list[ClientUpdate], combine: Combine
) -> dict[str, float]:
    """The server step of a weighted-sum algorithm applied to ``combine`` of the payloads, as a delta of weight 1."""
    return algorithm.apply_weighted_sum(round_idx, global_state, combine([u.payload for u in updates]), 1.0)


def aggregate_with(algorithm: Algorithm, round_idx: int, global_state: State, updates: list[ClientUpdate], combine: Combine) -> dict[str, float]:
    """``algorithm``'s aggregation of ``updates`` with ``combine`` in place of its averaging (see :func:`can_combine`)."""
    if isinstance(algorithm, SupportsCombine):
        return algorithm.aggregate_with(round_idx, global_state, updates, combine)
    assert isinstance(algorithm, SupportsWeightedSum)
    return apply_combined(algorithm, round_idx, global_state, updates, combine)
