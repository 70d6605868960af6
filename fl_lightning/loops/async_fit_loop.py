"""Buffered asynchronous FL on a virtual clock, inside one Lightning ``fit``."""

from __future__ import annotations

import copy
import heapq
import time
from dataclasses import replace
from typing import Any

import torch
from typing_extensions import override

from fl_lightning.checkpointing.checkpoint_io import CheckpointError
from fl_lightning.loops.async_state import check_async_state
from fl_lightning.utils.saved_state import InvalidStateError
from fl_lightning.algorithms.shared.asynchronous import AsyncAlgorithm
from fl_lightning.algorithms.shared.algorithm import Algorithm, ClientUpdate
from fl_lightning.algorithms.shared.wrapper import AlgorithmWrapper
from fl_lightning.loops.federated_fit_loop import FederatedFitLoop
from fl_lightning.loops.records import kept_records
from fl_lightning.server.model_state import moved
from fl_lightning.utils.seeding import derive_seed


class AsyncFitLoop(FederatedFitLoop):
    """One Lightning epoch is one server aggregation (model version); no threads, no sleeps.

    Example::

        dispatch `concurrency` clients at t = 0 with version 0
        for version in range(max_epochs):                  # on_train_epoch_start
            repeat:
                pop the earliest arrival (time, client); clock <- time
                buffer += its update (computed at dispatch from the model it pulled;
                                      with train_at="arrival", computed now from the current model)
                if |buffer| == buffer_size:
                    staleness_j = version - pulled_version_j
                    algorithm.aggregate(version, global, buffer); version += 1
                    dispatch the parked clients (wait_new_version)
                dispatch the next client (the arriving one, or an idle one) per the pull policy
            until the buffer was aggregated
            server evaluation, round metrics (+ virtual time)    # on_train_epoch_end

    A dispatched client trains at once through the same Lightning client path as the
    synchronous loop (:meth:`train_client`) and its update waits in the event queue until
    it arrives at ``dispatch time + duration``; ties arrive in dispatch order. It reads only the
    :class:`~fl_lightning.algorithms.shared.asynchronous.AsyncAlgorithm` contract. The ``j``-th
    dispatch of a client at one model version draws its data order from
    ``(seed, "client", version, client[, j])``, so with every client in flight and equal
    speeds the first pass equals a synchronous round. With ``train_at="arrival"`` the
    client trains when it arrives instead, from the model current then, with the data order of
    its dispatch (so the events and data are the same in both modes). The whole simulation state (clock,
    queue, in-flight updates, buffer) is checkpointed; a checkpoint taken inside an epoch
    holds the state at the epoch's start, which is replayed identically on resume.
    """

    @property
    def async_algorithm(self) -> AsyncAlgorithm:
        """The asynchronous algorithm whose settings drive the simulation, under any wrappers (robust rules, attacks)."""
        core = async_core(self.algorithm)
        assert core is not None
        return core

    def _reset_simulation(self, n: int) -> None:
        self.clock = 0.0
        self._queue: list[tuple[float, int, int]] = []
        #: client -> (its update, or None until it trains at arrival; the version it pulled).
        self._in_flight: dict[int, tuple[ClientUpdate | None, int]] = {}
        #: Data-order seeds of the clients in flight that train at arrival.
        self._arrival_seeds: dict[int, int] = {}
        self._buffer: list[tuple[ClientUpdate, int]] = []
        self._parked: list[int] = []
        self._seq = 0
        self._jobs = [0] * n
        self._last_version = [-1] * n
        self._repeats = [0] * n
        #: Every arrival so far, from arrival number ``arrivals_start`` on (a resumed run has the checkpoint's
        #: newest ones, :mod:`~fl_lightning.loops.records`): (virtual time, client, version it pulled).
        self.arrivals: list[tuple[float, int, int]] = []
        self.arrivals_start = 0
        self._started = False
        self._epoch_start: dict[str, Any] | None = None

    @override
    def _setup_federation(self) -> None:
        if async_core(self.algorithm) is None:
            raise TypeError(
                f"AsyncFitLoop runs buffered asynchronous algorithms (subclasses of AsyncAlgorithm: FedBuff, FedStaleWeight, "
                f"FedAsync), got {type(self.algorithm).__name__}."
            )
        self._reset_simulation(getattr(self.trainer.datamodule, "num_clients", 0))
        super()._setup_federation()  # restores a checkpoint's simulation state, if any

    @override
    def on_advance_start(self) -> None:
        super().on_advance_start()
        # The append-only records are kept by length, not copied: a snapshot per aggregation
        # must cost O(state), not O(run length).
        self._epoch_start = self._checkpoint_state()

    @override
    def advance(self) -> None:
        version = self.epoch_progress.current.processed
        started = time.perf_counter()
        self._in_round = True
        dispatches = 0
        if not self._started:
            order = torch.randperm(self.federation.num_clients, generator=self.federation.generator("initial-dispatch"))
            initial = sorted(order[: self.async_algorithm.concurrency].tolist())
            for cid in initial:
                self._dispatch(cid, version)
            dispatches, self._started = len(initial), True
        received: list[ClientUpdate] = []
        while True:
            self.clock, _, cid = heapq.heappop(self._queue)
            update, pulled = self._in_flight.pop(cid)
            if update is None:  # train_at="arrival": on the model current now (parameter staleness 0)
                update = self.train_client(version, cid, seed=self._arrival_seeds.pop(cid))
            update = replace(update, payload=moved(update.payload, self.trainer.strategy.root_device))
            self.arrivals.append((self.clock, cid, pulled))
            self._buffer.append((update, pulled))
            received.append(update)
            full = len(self._buffer) == self.async_algorithm.buffer_size
            if full:
                buffer = [copy.copy(u) for u, _ in self._buffer]
                for u, (_, pulled_version) in zip(buffer, self._buffer):
                    u.staleness = version - pulled_version
                self.history.append([u.client_id for u in buffer])
                metrics = self.aggregate(version, buffer)
                self._buffer = []
                parked, self._parked = self._parked, []
                for p in parked:
                    self._dispatch(p, version + 1)
                dispatches += len(parked)
            dispatches += self._pull(self._next_client(cid), version + full)
            if full:
                break
        self._load_global_model()
        download_bytes = dispatches * self.algorithm.download_bytes(self.global_state)
        metrics.update({"virtual_time": self.clock, "version": float(version + 1)})
        self.end_round(version, started, received, download_bytes, metrics)

    def _next_client(self, arrived: int) -> int:
        """The client to dispatch into the freed slot: the arriving one when every client is in
        flight (it re-pulls), else one drawn uniformly from the idle clients."""
        if self.async_algorithm.concurrency == self.federation.num_clients:
            return arrived
        busy = set(self._in_flight) | set(self._parked)
        idle = [c for c in range(self.federation.num_clients) if c not in busy]
        return idle[int(torch.randint(len(idle), (), generator=self.federation.generator("dispatch", self._seq)))]

    def _pull(self, cid: int, version: int) -> int:
        """Dispatches ``cid`` now, or parks it until the next version (``wait_new_version``)."""
        if self.async_algorithm.pull_policy == "wait_new_version" and self._last_version[cid] == version:
            self._parked.append(cid)
            return 0
        self._dispatch(cid, version)
        return 1

    def _dispatch(self, cid: int, version: int) -> None:
        self._repeats[cid] = self._repeats[cid] + 1 if self._last_version[cid] == version else 0
        self._last_version[cid] = version
        keys = (version, cid) if self._repeats[cid] == 0 else (version, cid, self._repeats[cid])
        seed = derive_seed(self.seed, "client", *keys)
        duration = self.async_algorithm.delays.duration(cid, self._jobs[cid])
        self._jobs[cid] += 1
        if self.async_algorithm.train_at == "arrival":
            self._in_flight[cid], self._arrival_seeds[cid] = (None, version), seed
        else:
            update = self.train_client(version, cid, seed=seed)
            # In flight on the CPU: with every client in flight, device memory would grow with the clients.
            self._in_flight[cid] = (replace(update, payload=moved(update.payload, torch.device("cpu"))), version)
        heapq.heappush(self._queue, (self.clock + duration, self._seq, cid))
        self._seq += 1

    def _checkpoint_state(self) -> dict[str, Any]:
        """The simulation state, with the lengths of the records ``arrivals`` and ``history``."""
        return {
            "clock": self.clock,
            "queue": list(self._queue),
            "in_flight": {c: (None if u is None else vars(u).copy(), v) for c, (u, v) in self._in_flight.items()},
            "arrival_seeds": dict(self._arrival_seeds),
            "buffer": [(vars(u).copy(), v) for u, v in self._buffer],
            "parked": list(self._parked),
            "seq": self._seq,
            "jobs": list(self._jobs),
            "last_version": list(self._last_version),
            "repeats": list(self._repeats),
            "arrivals": len(self.arrivals),
            "started": self._started,
            "history": len(self.history),
            "global_state": {k: v.clone() for k, v in self.global_state.items()},
            "algorithm": copy.deepcopy(self.algorithm.state_dict()),
        }

    @override
    def on_save_checkpoint(self) -> dict:
        state = super().on_save_checkpoint()
        federated = state["federated"]
        if self._in_round and self._epoch_start is not None:  # replay the epoch from its start
            simulation = dict(self._epoch_start)
            federated.update(global_state=simulation["global_state"], algorithm=simulation["algorithm"])
            # The aggregation may be done already (clients train at dispatch after it): it is replayed too.
            federated["rounds_done"] = self.epoch_progress.current.processed
            federated["history"], federated["history_start"] = self._saved_history(simulation["history"])
        else:
            simulation = self._checkpoint_state()
        simulation["arrivals"], simulation["arrivals_start"] = kept_records(self.arrivals[: simulation["arrivals"]], self.arrivals_start)
        federated["async"] = {k: v for k, v in simulation.items() if k not in ("global_state", "algorithm", "history")}
        return state

    @override
    def _restore(self, federated: dict[str, Any]) -> None:
        super()._restore(federated)
        state = federated.get("async")
        try:
            check_async_state(state, num_clients=self.federation.num_clients, version=federated["rounds_done"])
        except InvalidStateError as err:
            raise CheckpointError(f"Checkpoint {self.trainer.ckpt_path}: {err}") from err
        self.clock, self._seq, self._started = float(state["clock"]), int(state["seq"]), bool(state["started"])
        self._queue = [tuple(e) for e in state["queue"]]  # type: ignore[misc]
        heapq.heapify(self._queue)
        self._in_flight = {int(c): (None if u is None else ClientUpdate(**u), int(v)) for c, (u, v) in state["in_flight"].items()}
        self._arrival_seeds = {int(c): int(seed) for c, seed in state.get("arrival_seeds", {}).items()}
        self._buffer = [(ClientUpdate(**u), int(v)) for u, v in state["buffer"]]
        self._parked = list(state["parked"])
        self._jobs, self._last_version = list(state["jobs"]), list(state["last_version"])
        self._repeats = list(state["repeats"])
        self.arrivals = [tuple(a) for a in state["arrivals"]]  # type: ignore[misc]
        self.arrivals_start = state.get("arrivals_start", 0)


def async_core(algorithm: Algorithm) -> AsyncAlgorithm | None:
    """The :class:`AsyncAlgorithm` that ``algorithm`` is or wraps (through any :class:`AlgorithmWrapper`), else ``None``.

    The loop calls every hook on ``algorithm`` itself, so a wrapper changes what it overrides
    (an attack, a robust rule over each buffer) and the simulation reads the wrapped settings."""
    while isinstance(algorithm, AlgorithmWrapper):
        algorithm = algorithm.inner
    return algorithm if isinstance(algorithm, AsyncAlgorithm) else None
