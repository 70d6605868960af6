"""Aggregations that are a weighted sum of client deltas followed by a server step.

Splitting :meth:`~fl_lightning.Algorithm.aggregate` into a sum over clients and a server
step makes the sum additive over any split of the clients: with several processes each rank
sums its own clients and one all-reduce combines the partial sums
(:class:`~fl_lightning.distributed.ClientSharding`).
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import replace
from typing import Protocol, runtime_checkable

from typing_extensions import override

from fl_lightning.algorithms.shared.aggregation import RunningSum, weighted_sum
from fl_lightning.algorithms.shared.algorithm import Algorithm, ClientUpdate
from fl_lightning.algorithms.shared.folding import RoundFold
from fl_lightning.server.model_state import State


@runtime_checkable
class SupportsWeightedSum(Protocol):
    """What client sharding needs of an algorithm (:class:`SummableAggregation` or a wrapper of one)."""

    @property
    def summable(self) -> bool: ...

    def weighted_delta_sum(self, updates: list[ClientUpdate]) -> tuple[State, float]: ...

    def apply_weighted_sum(self, round_idx: int, global_state: State, total: State, weight: float) -> dict[str, float]: ...

    def report_metrics(self, reports: list[ClientUpdate]) -> dict[str, float]: ...


def can_shard(algorithm: Algorithm) -> bool:
    """Whether a round's clients may train on several processes: a synchronous weighted-sum aggregation."""
    return isinstance(algorithm, SupportsWeightedSum) and algorithm.summable and not algorithm.asynchronous


def apply_sum(
    algorithm: SupportsWeightedSum, round_idx: int, global_state: State, total: State, weight: float, reports: list[ClientUpdate]
) -> dict[str, float]:
    """The server step on the weighted sum ``(total, weight)`` of the clients ``reports`` describe, and the
    metrics of those reports; with client sharding ``reports`` are the all-reduced, payload-free ones."""
    return {**algorithm.apply_weighted_sum(round_idx, global_state, total, weight), **algorithm.report_metrics(reports)}


def aggregate_weighted_sum(
    algorithm: SupportsWeightedSum, round_idx: int, global_state: State, updates: list[ClientUpdate]
) -> dict[str, float]:
    """One process's aggregation of a weighted-sum algorithm: :func:`apply_sum` of its sum over ``updates``."""
    total, weight = algorithm.weighted_delta_sum(updates)
    return apply_sum(algorithm, round_idx, global_state, total, weight, updates)


class SummableAggregation(Algorithm):
    r"""An algorithm whose server update depends on the clients only through
    :math:`(\sum_k w_k \Delta_k, \sum_k w_k)`.

    Override :meth:`aggregation_weight`, :meth:`apply_weighted_sum` and, for metrics of the
    clients' reports, :meth:`report_metrics`, not ``aggregate``: an algorithm that overrides
    ``aggregate`` is no longer summable (:attr:`summable` is then ``False``) and cannot shard its
    clients over processes. Its client-side hooks
    (``configure_client``, ``client_update``) run only on the rank that trains the client, so
    they must not keep state that the server step needs.
    """

    def aggregate(self, round_idx: int, global_state: State, updates: list[ClientUpdate]) -> dict[str, float]:
        return aggregate_weighted_sum(self, round_idx, global_state, updates)

    def weighted_delta_sum(self, updates: list[ClientUpdate]) -> tuple[State, float]:
        r""":math:`(\sum_k w_k \Delta_k, \sum_k w_k)` over ``updates``, summed in their order."""
        weights = [self.aggregation_weight(update) for update in updates]
        return weighted_sum([u.payload for u in updates], weights), float(sum(weights))

    @override
    def start_fold(self, round_idx: int, global_state: State) -> RoundFold | None:
        """A :class:`WeightedSumFold` while the aggregation is this class's weighted sum of the uploads as sent
        (neither ``aggregate``, ``weighted_delta_sum`` nor ``decode_update`` overridden: a decoder keeps the gathered
        path) and an empty round aggregates nothing."""
        own = type(self).weighted_delta_sum is SummableAggregation.weighted_delta_sum
        plain = type(self).decode_update is Algorithm.decode_update
        if self.summable and own and plain and not self.aggregates_empty_rounds:
            return WeightedSumFold(self, round_idx, global_state)
        return None

    @abstractmethod
    def aggregation_weight(self, update: ClientUpdate) -> float:
        """The weight :math:`w_k` of one client's delta."""

    @abstractmethod
    def apply_weighted_sum(self, round_idx: int, global_state: State, total: State, weight: float) -> dict[str, float]:
        """Updates ``global_state`` in place from the weighted sum ``total`` of deltas and the sum of weights."""

    def report_metrics(self, reports: list[ClientUpdate]) -> dict[str, float]:
        """Round metrics of the summed clients from their scalar fields (bytes, steps, samples), never their
        payloads: under client sharding they come from the all-reduced reports. None by default."""
        return {}

    @property
    def summable(self) -> bool:
        """Whether ``aggregate`` is still the weighted sum (no subclass overrides it)."""
        return type(self).aggregate is SummableAggregation.aggregate


class WeightedSumFold(RoundFold):
    r""":meth:`SummableAggregation.aggregate`, folded: :math:`(\sum_k w_k \Delta_k, \sum_k w_k)` accumulated in the
    clients' order (:class:`~fl_lightning.algorithms.shared.aggregation.RunningSum`, :func:`weighted_sum`'s own
    operations), then :func:`apply_sum` with the clients' payload-free reports."""

    def __init__(self, algorithm: SummableAggregation, round_idx: int, global_state: State) -> None:
        self.algorithm, self.round_idx, self.global_state = algorithm, round_idx, global_state
        self.running = RunningSum()
        self.reports: list[ClientUpdate] = []

    @override
    def add(self, update: ClientUpdate) -> None:
        self.running.add(update.payload, self.algorithm.aggregation_weight(update))
        self.reports.append(replace(update, payload={}))

    @override
    def finish(self) -> dict[str, float]:
        running = self.running
        return apply_sum(self.algorithm, self.round_idx, self.global_state, running.total, running.weight, self.reports)
