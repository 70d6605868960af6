"""A synchronous round whose aggregation is folded in as each client finishes (:mod:`~fl_lightning.algorithms.shared.folding`).

The loop takes this path, on one process, when the algorithm gives a fold (:meth:`~fl_lightning.Algorithm.start_fold`)
and the update bound (if any) scales each update from its own norm: each client's update is decoded, screened,
bounded and added to the fold before the next client trains, so the round holds one update, not all of them. The
aggregation's roll-back (:func:`~fl_lightning.loops.guards.aggregate_or_roll_back`) spans the whole round: a
non-finite aggregate, or an exception between two clients, leaves the global model, the algorithm's state and the
entries its folds wrote as they were; the clients' own writes during training are not recorded
(:func:`~fl_lightning.server.client_store.recording_paused`), as when they train before the aggregation.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from functools import partial

from fl_lightning.algorithms.shared.algorithm import Algorithm, ClientUpdate
from fl_lightning.algorithms.shared.folding import RoundFold
from fl_lightning.loops.guards import aggregate_or_roll_back, decode_and_screen
from fl_lightning.server.client_store import recording_paused
from fl_lightning.server.model_state import State

#: The update bound applied to one client's screened updates: those kept (maybe scaled) and the ids it rejects.
Bound = Callable[[list[ClientUpdate]], tuple[list[ClientUpdate], list[int]]]


@dataclass
class StreamedRound:
    """What a streamed round leaves: the clients' payload-free reports, in order, and the fates of their updates."""

    received: list[ClientUpdate] = field(default_factory=list)
    aggregated: int = 0
    dropped: int = 0
    rejected: int = 0
    metrics: dict[str, float] = field(default_factory=dict)
    rolled_back: bool = False


def stream_round(
    round_idx: int, algorithm: Algorithm, updates: Iterator[ClientUpdate], fold: RoundFold, global_state: State, bound: Bound
) -> StreamedRound:
    """Trains the round's clients (``updates``, an executor's :meth:`~fl_lightning.loops.client_executor.ClientExecutor.stream`)
    and folds each usable update into ``fold``; its server step runs once at least one was added."""
    result = StreamedRound()
    stores = list(algorithm.client_stores().values())

    def fold_one(update: ClientUpdate) -> None:
        result.received.append(replace(update, payload={}))
        screened = decode_and_screen(algorithm, round_idx, [update])
        kept, refused = bound(screened.finite)
        for usable in kept:
            fold.add(usable)
        result.aggregated += len(kept)
        result.dropped += len(screened.dropped)
        result.rejected += len(screened.rejected) + len(refused)

    def trained_paused() -> ClientUpdate | None:
        with recording_paused(stores):
            return next(updates, None)

    # Without stores there is nothing to pause: no context to open per client.
    next_update = trained_paused if stores else partial(next, updates, None)

    def train_and_fold() -> dict[str, float]:
        while True:
            update = next_update()
            if update is None:
                break
            fold_one(update)
            del update  # freed before the next client trains
        return fold.finish() if result.aggregated else {}

    result.metrics, result.rolled_back = aggregate_or_roll_back(round_idx, algorithm, global_state, train_and_fold)
    return result
