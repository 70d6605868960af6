"""The server's checks between the clients' uploads and the new global model.

Every update's fate is one of: *rejected* (malformed payload, or refused by the update bound),
*dropped* (non-finite values or training loss, unless the algorithm aggregates a stand-in in its place:
:meth:`~fl_lightning.Algorithm.replace_non_finite`) or *aggregated*; so ``aggregated + dropped + rejected = clients``.
The aggregation itself is guarded too: a new global model (or server state) that is not finite
is rolled back (:func:`aggregate_or_roll_back`), and so is one whose buffers are no longer valid
statistics: a negative BatchNorm ``running_var`` (an aggregation that extrapolates buffers).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from torch import Tensor

from fl_lightning.algorithms.shared.algorithm import Algorithm, ClientUpdate
from fl_lightning.compression.wire import PayloadError
from fl_lightning.server.client_store import excluded_from_state_dicts
from fl_lightning.server.model_state import State, all_finite, load_into
from fl_lightning.robust.update_bounds import UpdateBound, scaled, update_norm


@dataclass
class Screened:
    """A batch of updates after :func:`decode_and_screen`.

    Attributes:
        finite: the decoded updates free of NaN/Inf, in arrival order.
        dropped: the ids of clients whose update was non-finite.
        rejected: the ids of clients whose payload was malformed.
        replaced: the ids of clients whose non-finite update the algorithm replaced
            (:meth:`~fl_lightning.Algorithm.replace_non_finite`); their stand-ins are in ``finite``.
    """

    finite: list[ClientUpdate]
    dropped: list[int]
    rejected: list[int]
    replaced: list[int] = field(default_factory=list)


def decode_and_screen(algorithm: Algorithm, round_idx: int, received: Sequence[ClientUpdate]) -> Screened:
    """Decodes every update (:meth:`~fl_lightning.Algorithm.decode_update`) and sets apart, with a
    warning each, the malformed ones (rejected) and the non-finite ones (dropped, or replaced by the
    algorithm's stand-in: :meth:`~fl_lightning.Algorithm.replace_non_finite`)."""
    screened = Screened(finite=[], dropped=[], rejected=[])
    for update in received:
        try:
            decoded = algorithm.decode_update(update)
        except PayloadError as err:
            rank_zero_warn(f"Round {round_idx}: client {update.client_id} sent an undecodable payload ({err}); it is rejected.")
            screened.rejected.append(update.client_id)
            continue
        # A diverged client's upload can look finite (FedMRN's mask of a NaN latent update is all zeros),
        # so the loss it reports is screened too.
        diverged = not math.isfinite(update.metrics.get("train_loss", 0.0))
        if not diverged and all_finite(decoded.payload):
            screened.finite.append(decoded)
            continue
        why = "its training loss is NaN/Inf" if diverged else "NaN/Inf"
        stand_in = algorithm.replace_non_finite(decoded)
        if stand_in is None:
            rank_zero_warn(f"Round {round_idx}: client {update.client_id} sent a non-finite update ({why}); it is dropped.")
            screened.dropped.append(update.client_id)
        else:
            rank_zero_warn(
                f"Round {round_idx}: client {update.client_id} sent a non-finite update ({why}); "
                f"{type(algorithm).__name__} aggregates a stand-in in its place."
            )
            screened.finite.append(stand_in)
            screened.replaced.append(update.client_id)
    return screened


def apply_bound(
    bound: UpdateBound, round_idx: int, updates: Sequence[ClientUpdate], scales: Sequence[float | None]
) -> tuple[list[ClientUpdate], list[int]]:
    """The updates scaled by ``scales`` (from ``bound.scales``) and the ids of those it rejects (``None``)."""
    kept, rejected = [], []
    for update, scale in zip(updates, scales, strict=True):
        if scale is None:
            rank_zero_warn(f"Round {round_idx}: {type(bound).__name__} rejects client {update.client_id}'s update.")
            rejected.append(update.client_id)
        else:
            kept.append(update if scale == 1.0 else replace(update, payload=scaled(update.payload, scale)))
    return kept, rejected


def bound_updates(bound: UpdateBound, round_idx: int, updates: Sequence[ClientUpdate]) -> tuple[list[ClientUpdate], list[int]]:
    """:func:`apply_bound` with the scales ``bound`` gives these updates' norms."""
    return apply_bound(bound, round_idx, updates, bound.scales([update_norm(u.payload) for u in updates]))


def aggregate_or_roll_back(
    round_idx: int, algorithm: Algorithm, global_state: State, aggregate: Callable[[], dict[str, float]]
) -> tuple[dict[str, float], bool]:
    """Runs ``aggregate`` (which updates ``global_state`` and the algorithm's state in place) and
    undoes it if the new global model or the algorithm's state holds NaN/Inf, or a BatchNorm running
    variance (a ``*running_var`` buffer) of the new global model is negative; the warning names the algorithm.
    An exception inside ``aggregate`` undoes it too (silently) before it propagates.

    A finite but huge update can overflow the weighted sum (or a server optimizer's moments);
    without the rollback every later update would be dropped against an Inf model.

    Returns:
        The aggregation's metrics and whether it was rolled back.
    """
    saved_global = {name: t.clone() for name, t in global_state.items()}
    # Per-client state is not copied (nor gathered across ranks) every round: the stores record what changes.
    stores = list(algorithm.client_stores().values())
    with excluded_from_state_dicts(stores):
        saved_algorithm = copy.deepcopy(algorithm.state_dict())
    for store in stores:
        store.record_changes()
    try:
        metrics = aggregate()
        with excluded_from_state_dicts(stores):
            finite = all_finite(global_state) and nested_finite(algorithm.state_dict())
        negative = negative_variances(global_state) if finite else []
        if not finite or negative:
            for store in stores:
                store.undo_changes()
    except BaseException:
        # An aggregation that stops half way (a streamed round interrupted between two clients) leaves no trace:
        # a mid-round checkpoint then replays the round from the state before it.
        for store in stores:
            store.undo_changes()
        load_into(global_state, saved_global)
        algorithm.load_state_dict(saved_algorithm)
        raise
    finally:
        for store in stores:
            store.stop_recording()
    if finite and not negative:
        return metrics, False
    name = type(algorithm).__name__
    why = (
        f"{name}'s aggregate is not finite (NaN/Inf, e.g. an overflowing client update)"
        if not finite
        else f"{name}'s aggregate has a negative BatchNorm running variance ({', '.join(negative[:3])})"
    )
    rank_zero_warn(
        f"Round {round_idx}: {why}; the round is rolled back: the global model and the algorithm's state stay as before it."
    )
    load_into(global_state, saved_global)
    algorithm.load_state_dict(saved_algorithm)  # its stores keep their (restored) entries
    return metrics, True


def negative_variances(state: State) -> list[str]:
    """The names of ``state``'s BatchNorm running variances (``*running_var``) with a negative entry."""
    names = [name for name, t in state.items() if name.endswith("running_var") and t.is_floating_point()]
    if not names:
        return []
    negative = torch.stack([(state[name] < 0).any() for name in names]).tolist()  # one sync
    return [name for name, bad in zip(names, negative) if bad]


def nested_finite(state: Any) -> bool:
    """Whether every float in a nested structure of tensors, arrays, numbers, dicts and lists is finite
    (one device sync per device)."""
    by_device: dict[torch.device, State] = {}
    for i, leaf in enumerate(_leaves(state)):
        if isinstance(leaf, Tensor):
            by_device.setdefault(leaf.device, {})[str(i)] = leaf
        elif isinstance(leaf, np.ndarray):
            if leaf.dtype.kind in "fc" and not np.isfinite(leaf).all():
                return False
        elif isinstance(leaf, float) and not math.isfinite(leaf):
            return False
    return all(all_finite(tensors) for tensors in by_device.values())


def _leaves(state: Any) -> Iterator[Any]:
    if isinstance(state, dict):
        for value in state.values():
            yield from _leaves(value)
    elif isinstance(state, (list, tuple)):
        for value in state:
            yield from _leaves(value)
    else:
        yield state
