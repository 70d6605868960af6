"""The asynchronous loop's saved simulation state, checked against what the virtual clock can produce.

:class:`~fl_lightning.loops.async_fit_loop.AsyncFitLoop` saves its event queue, the clients in flight, the
buffer and per-client counters; an edited entry (a NaN clock, a queued client with no update in flight, a
counter list of the wrong length) would otherwise surface rounds later as a raw ``IndexError`` or
``KeyError``, or run a simulation no configuration produces. :func:`check_async_state` refuses it on load.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from fl_lightning.algorithms.shared.client_update import ClientUpdate
from fl_lightning.utils.saved_state import InvalidStateError, check_client_id, check_number

_UPDATE_FIELDS = frozenset(f.name for f in dataclasses.fields(ClientUpdate))
_REQUIRED_FIELDS = frozenset(f.name for f in dataclasses.fields(ClientUpdate) if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)


def check_async_state(state: Any, *, num_clients: int, version: int) -> None:
    """Checks ``state`` (the checkpoint's ``federated["async"]``) for a federation of ``num_clients`` at model
    ``version``: a finite clock; counters that are ints, one per client; every queued event a finite time at
    or after the clock, a sequence number below ``seq`` and a client in flight, and every client in flight
    queued; updates with :class:`~fl_lightning.algorithms.ClientUpdate`'s fields; versions at most ``version``;
    no more arrivals (kept ones and ``arrivals_start`` dropped ones) than dispatches.

    Raises:
        InvalidStateError: naming the entry (``async.<name>``) and what is allowed.
    """
    if not isinstance(state, Mapping):
        raise InvalidStateError(f"`async` must be the simulation state, got {type(state).__name__}.")
    clock = check_number("async.clock", state.get("clock"), low=0.0)
    seq = _count("async.seq", state.get("seq"))
    for name in ("jobs", "last_version", "repeats"):
        values = state.get(name)
        if not isinstance(values, list) or len(values) != num_clients:
            raise InvalidStateError(f"`async.{name}` must hold one int per client ({num_clients}), got {values!r:.80}.")
        low = -1 if name == "last_version" else 0
        for cid, value in enumerate(values):
            _count(f"async.{name}[{cid}]", value, low=low, high=version if name == "last_version" else None)
    queue = state.get("queue")
    if not isinstance(queue, list):
        raise InvalidStateError(f"`async.queue` must be a list of (time, seq, client) events, got {queue!r:.80}.")
    queued = set()
    for i, event in enumerate(queue):
        if not isinstance(event, (list, tuple)) or len(event) != 3:
            raise InvalidStateError(f"`async.queue[{i}]` must be (time, seq, client), got {event!r:.80}.")
        check_number(f"async.queue[{i}] time", event[0], low=clock)
        _count(f"async.queue[{i}] seq", event[1], high=seq - 1)
        queued.add(check_client_id(f"async.queue[{i}] client", event[2], num_clients))
    in_flight = state.get("in_flight")
    if not isinstance(in_flight, Mapping) or set(in_flight) != queued:
        found = sorted(in_flight) if isinstance(in_flight, Mapping) else type(in_flight).__name__
        raise InvalidStateError(f"`async.in_flight` must name exactly the queued clients {sorted(queued)}, got {found}.")
    for cid, entry in in_flight.items():
        update, _ = _versioned(f"async.in_flight[{cid}]", entry, version)
        if update is not None:
            _check_update(f"async.in_flight[{cid}]", update, num_clients, client=cid)
    for cid, seed in state.get("arrival_seeds", {}).items():
        if cid not in in_flight or in_flight[cid][0] is not None or isinstance(seed, bool) or not isinstance(seed, int):
            raise InvalidStateError(f"`async.arrival_seeds[{cid}]` must be the int seed of a client in flight without an update.")
    buffer = state.get("buffer")
    if not isinstance(buffer, list):
        raise InvalidStateError(f"`async.buffer` must be a list of (update, version) pairs, got {buffer!r:.80}.")
    for i, entry in enumerate(buffer):
        update, _ = _versioned(f"async.buffer[{i}]", entry, version)
        _check_update(f"async.buffer[{i}]", update, num_clients)
    parked = state.get("parked")
    if not isinstance(parked, list):
        raise InvalidStateError(f"`async.parked` must be a list of client ids, got {parked!r:.80}.")
    for i, cid in enumerate(parked):
        check_client_id(f"async.parked[{i}]", cid, num_clients)
    arrivals = state.get("arrivals")
    if not isinstance(arrivals, list) or not all(isinstance(a, (list, tuple)) and len(a) == 3 for a in arrivals):
        raise InvalidStateError("`async.arrivals` must be a list of (time, client, version) records.")
    # Every arrival was dispatched first, and each dispatch took a sequence number.
    _count("async.arrivals_start", state.get("arrivals_start", 0), high=seq - len(arrivals))


def _count(name: str, value: Any, *, low: int = 0, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        allowed = f"an int >= {low}" + ("" if high is None else f" and <= {high}")
        raise InvalidStateError(f"`{name}` must be {allowed}, got {value!r:.80}.")
    return value


def _versioned(name: str, entry: Any, version: int) -> tuple[Any, int]:
    if not isinstance(entry, (list, tuple)) or len(entry) != 2:
        raise InvalidStateError(f"`{name}` must be (update, version), got {entry!r:.80}.")
    return entry[0], _count(f"{name} version", entry[1], high=version)


def _check_update(name: str, update: Any, num_clients: int, client: int | None = None) -> None:
    if not isinstance(update, Mapping) or not _REQUIRED_FIELDS <= set(update) <= _UPDATE_FIELDS:
        found = sorted(update) if isinstance(update, Mapping) else type(update).__name__
        raise InvalidStateError(f"`{name}` must be a client update with fields {sorted(_UPDATE_FIELDS)}, got {found}.")
    cid = check_client_id(f"{name} client_id", update["client_id"], num_clients)
    if client is not None and cid != client:
        raise InvalidStateError(f"`{name}` holds client {cid}'s update.")
    for count in ("num_samples", "num_steps", "upload_bytes"):
        _count(f"{name} {count}", update[count])
