"""Streamed aggregation: a round's client updates folded into running sums as each client finishes.

An aggregation that is a sum over the round's clients (FedAvg's :math:`\\sum_k w_k \\Delta_k`, SCAFFOLD's means of
:math:`\\Delta y_i` and :math:`\\Delta c_i`, Algorithm 1 lines 16-17) needs none of the updates once it has added it,
so the round need not hold them all: the loop asks :meth:`~fl_lightning.Algorithm.start_fold` for a
:class:`RoundFold`, adds each decoded update the moment its client finishes (in the clients' order) and calls
:meth:`RoundFold.finish` in place of :meth:`~fl_lightning.Algorithm.aggregate`. A fold performs ``aggregate``'s
operations in ``aggregate``'s order (``aggregate`` is written as a fold over its list), so the weights are the same
bits. Aggregations that read every update at once (robust rules, secure aggregation, DP mechanisms, decoded
compressed uploads, FedNova, FedDyn, ...) give no fold and keep the gathered path.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from fl_lightning.algorithms.shared.client_update import ClientUpdate


class RoundFold(ABC):
    """One round's aggregation, one update at a time."""

    @abstractmethod
    def add(self, update: ClientUpdate) -> None:
        """Folds in one decoded, finite update (the next in the clients' order); the caller may then free it."""

    @abstractmethod
    def finish(self) -> dict[str, float]:
        """The server step on what was added (at least one update): updates the global state and the algorithm's
        state in place, as ``aggregate`` over the same updates would; returns the round's metrics."""


def fold_all(fold: RoundFold, updates: list[ClientUpdate]) -> dict[str, float]:
    """``fold`` over ``updates`` in their order, then its server step: an ``aggregate`` written as its fold."""
    for update in updates:
        fold.add(update)
    return fold.finish()
