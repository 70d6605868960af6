"""The per-client state store: what an algorithm remembers about each client between rounds.

Control variates (SCAFFOLD), linear terms (FedDyn), personalised models (Ditto, FedSoft),
norm layers (FedBN), optimizer moments: every algorithm that remembers a client keeps it in a
:class:`ClientStore`, never in a dict of its own, so memory, checkpoints and client sharding are
handled in one place. Each entry is a flat :data:`~fl_lightning.server.model_state.State` (name ->
tensor) kept on the CPU in at least float32, never on the accelerator, whose memory would
otherwise grow with the number of clients.

Memory: beyond its budget (:meth:`ClientStore.bind`, set by the loop from
``FederatedTrainer(client_state_memory=...)``) the store writes its least recently used entries to
disk, into one file (:class:`~fl_lightning.server.spill_arena.SpillArena`) in a folder of its own
(:mod:`~fl_lightning.server.spill_folder`), removed with the store, or by the next fit's start-up sweep after a
kill; a spilled entry is read back bit for bit when asked for. A checkpoint never depends on a spill file: it
holds every entry inline (:meth:`ClientStore.state_dict`), or, written by
:class:`~fl_lightning.checkpointing.checkpoint_io.CheckedCheckpointIO`, references to shard files beside it
(:mod:`~fl_lightning.checkpointing.client_shards`), which find the entries a round changed by their revision.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import uuid
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import torch
from torch import Tensor

from fl_lightning.server.model_state import State
from fl_lightning.server.spill_arena import SpillArena
from fl_lightning.server.spill_folder import make_spill_folder, release_spill_folder

#: Entries of every rank, gathered for a checkpoint (client sharding: :meth:`ClientSharding.gather_entries`).
Gather = Callable[[dict[int, State]], dict[int, State]]
#: A tensor summed over the ranks (client sharding: :meth:`ClientSharding.sum_tensor`).
Reduce = Callable[[Tensor], Tensor]


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, which hands freed heap memory back to the system; ``None`` without glibc."""
    try:
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None


_MALLOC_TRIM = _malloc_trim()
#: The heap is trimmed each time this fraction (1 / it) of the budget has been spilled.
_TRIM_EVERY = 8


def cpu_copy(tensors: Mapping[str, Tensor]) -> State:
    """Detached CPU copies; floating-point tensors in at least float32 (the master-copy rule)."""
    return {
        name: t.detach().to(
            device="cpu", dtype=torch.promote_types(t.dtype, torch.float32) if t.is_floating_point() else t.dtype, copy=True
        )
        for name, t in tensors.items()
    }


def state_nbytes(state: Mapping[str, Tensor]) -> int:
    """Bytes of the tensors of ``state``."""
    return sum(t.numel() * t.element_size() for t in state.values())


class ClientStore:
    """Client id -> that client's state (a flat name -> tensor mapping), on the CPU or spilled to disk.

    The interface every stateful algorithm uses: :meth:`get`, :meth:`put`, ``in``, ``len``, :meth:`ids`,
    :meth:`items`, :meth:`nbytes`, and :meth:`state_dict` / :meth:`load_state_dict` for checkpoints.
    ``put`` stores CPU copies (:func:`cpu_copy`), so the caller may reuse or free what it passed, and gives the
    entry a new revision (:meth:`revision`); an entry read with ``get`` or ``items`` is never changed in place (put a
    new one), or a checkpoint that reuses the entry's revision would hold its old values. Unbound (the default), it keeps everything in memory; the loop binds it at set-up (:meth:`bind`).
    """

    def __init__(self) -> None:
        #: Entries in memory, least recently used first.
        self._memory: OrderedDict[int, State] = OrderedDict()
        self._spilled: set[int] = set()
        #: Entries in memory whose copy in the spill file (read back by :meth:`get`) is still theirs: evicted or set
        #: aside without a write, as an entry is never changed in place.
        self._clean: set[int] = set()
        self._sizes: dict[int, int] = {}
        self._resident = 0
        self._budget: int | None = None
        self._parent: str | None = None
        self._folder: str | None = None
        self._arena: SpillArena | None = None
        self._untrimmed = 0  # bytes spilled since the last malloc_trim
        self._owns: Callable[[int], bool] | None = None
        self._gather: Gather | None = None
        self._reduce: Reduce | None = None
        #: While recording (:meth:`record_changes`): each changed client's entry before the first change (None: none).
        self._undo: dict[int, State | str | None] | None = None
        self._excluded = False
        self._new_revisions()

    def _new_revisions(self) -> None:
        """A new revision prefix, drawn once per store and process, and a new revision for every entry."""
        self._uuid, self._counter = uuid.uuid4().hex[:16], 0
        self._revisions: dict[int, str] = {}
        for cid in self.ids():
            self._revise(cid)

    def _revise(self, cid: int) -> None:
        self._counter += 1
        self._revisions[cid] = f"{self._uuid}-{self._counter}"

    def revision(self, client_id: int) -> str | None:
        """The revision of client ``client_id``'s entry (``None``: it has none): ``<store uuid>-<counter>``, new at
        every :meth:`put`, so two entries with one revision are the same bytes without hashing them (incremental
        checkpoints, :mod:`~fl_lightning.checkpointing.client_shards`)."""
        return self._revisions.get(int(client_id))

    def bind(
        self,
        *,
        budget: int | None,
        folder: str | os.PathLike[str] | None = None,
        owns: Callable[[int], bool] | None = None,
        gather: Gather | None = None,
        reduce: Reduce | None = None,
    ) -> None:
        """Sets where and how much the store keeps.

        Args:
            budget: bytes of entries kept in memory; beyond it the least recently used spill to disk
                (``None``: no limit).
            folder: where the spill folder is made (the experiment's folder); ``None``: the system's temporary folder.
            owns: under client sharding, whether this rank trains a client: the store then holds only those
                clients (others are dropped, and reading or writing one is an error).
            gather: under client sharding, the collective that gives rank 0 every rank's entries for a checkpoint.
            reduce: under client sharding, the collective that sums a tensor over the ranks (:meth:`sum_over_ranks`).
        """
        self._budget, self._parent, self._owns, self._gather = budget, None if folder is None else os.fspath(folder), owns, gather
        self._reduce = reduce
        for cid in [c for c in self.ids() if owns is not None and not owns(c)]:
            self._remove(cid)
        self._fit_budget()

    def owns(self, client_id: int) -> bool:
        """Whether this process keeps client ``client_id``'s state: always, except under client sharding, where
        each rank keeps the clients it trains. An aggregation that sees every client (gathered updates) writes
        only the entries it owns."""
        return self._owns is None or self._owns(int(client_id))

    def get(self, client_id: int) -> State | None:
        """Client ``client_id``'s state, or ``None`` if it has none yet."""
        cid = self._owned(client_id)
        if cid in self._memory:
            self._memory.move_to_end(cid)
            return self._memory[cid]
        if cid not in self._spilled:
            return None
        assert self._arena is not None
        state = self._arena.read(cid)
        self._spilled.remove(cid)
        self._sizes.pop(cid)
        self._clean.add(cid)  # its range stays filed under cid until the entry is replaced or evicted
        self._keep(cid, state)
        return state

    def put(self, client_id: int, state: Mapping[str, Tensor]) -> None:
        """Stores (a CPU copy of) ``state`` as client ``client_id``'s, replacing any earlier one."""
        cid = self._owned(client_id)
        if self._undo is not None and cid not in self._undo:
            self._undo[cid] = self._set_aside(cid)
        self._discard(cid)
        self._keep(cid, cpu_copy(state))
        self._revise(cid)

    def __contains__(self, client_id: object) -> bool:
        return client_id in self._sizes

    def __len__(self) -> int:
        return len(self._sizes)

    def ids(self) -> list[int]:
        """The clients that have a state, in ascending order."""
        return sorted(self._sizes)

    def items(self) -> Iterator[tuple[int, State]]:
        """``(client_id, state)`` pairs in ascending client order; spilled entries are views of the memory-mapped
        spill file (not brought back into memory), valid until the store next changes: copy what is kept longer."""
        mapped = self._arena.map() if self._arena is not None else None
        for cid in self.ids():
            yield cid, self._memory[cid] if cid in self._memory else self._arena.view(cid, mapped)  # type: ignore[union-attr,arg-type]

    def sum_over_ranks(self, values: Tensor) -> Tensor:
        """``values`` (computed from this process's entries) summed over the processes that share the clients: under
        client sharding a collective (every rank calls it), else ``values``. For checks that need every client's entry."""
        return values if self._reduce is None else self._reduce(values)

    def spilled_ids(self) -> list[int]:
        """The clients whose entry is on disk, in ascending order."""
        return sorted(self._spilled)

    def nbytes(self) -> int:
        """Bytes of every entry, in memory and spilled."""
        return sum(self._sizes.values())

    def resident_nbytes(self) -> int:
        """Bytes of the entries in memory (at most the budget, or one entry when a single entry exceeds it)."""
        return self._resident

    @property
    def spill_folder(self) -> str | None:
        """The folder of this store's spilled entries (made at the first spill; ``None`` before)."""
        return self._folder

    def state_dict(self) -> dict[str, Any]:
        """Every entry (``entries``) and its revision (``revisions``, which a checkpoint IO may use to write only the
        entries it has not written yet); under client sharding rank 0's holds every rank's entries, without revisions
        (a collective: every rank calls it). Inside :func:`excluded_from_state_dicts`, no entry and a mark that
        :meth:`load_state_dict` leaves the store as is."""
        if self._excluded:
            return {"entries": {}, "excluded": True}
        entries = dict(self.items())
        if self._gather is not None:
            return {"entries": self._gather(entries)}
        return {"entries": entries, "revisions": {cid: self._revisions[cid] for cid in entries}}

    def record_changes(self) -> None:
        """Starts keeping, for each client :meth:`put` from now on, its entry before the first change, so that
        :meth:`undo_changes` can restore them (the loop's roll-back of a non-finite aggregation: the cost is the
        entries changed, not the whole store). Under a budget the kept entries wait in the spill file, not in
        memory: a round that changes 500 entries of 0.4 MB would otherwise hold 191 MiB beyond the budget."""
        self._undo = {}

    def undo_changes(self) -> None:
        """Restores the entries changed since :meth:`record_changes` and stops recording."""
        undo, self._undo = self._undo or {}, None
        for cid, before in undo.items():
            if before is None:
                self._remove(cid)
            elif before is _SET_ASIDE:
                assert self._arena is not None
                state = self._arena.read(_aside_key(cid))
                self._arena.free(_aside_key(cid))
                self.put(cid, state)
            else:
                self.put(cid, before)  # type: ignore[arg-type]

    def stop_recording(self) -> None:
        """Stops recording changes, keeping them."""
        undo, self._undo = self._undo or {}, None
        for cid in [cid for cid, before in undo.items() if before is _SET_ASIDE]:
            self._arena.free(_aside_key(cid))  # type: ignore[union-attr]

    def _set_aside(self, cid: int) -> State | str | None:
        """Client ``cid``'s entry before a recorded change: ``None`` (it has none), the entry (no budget), or
        :data:`_SET_ASIDE` once filed in the spill file under :func:`_aside_key` (a spilled entry is renamed there,
        not read)."""
        if cid not in self._sizes:
            return None
        if self._budget is None:
            return self.get(cid)
        if cid in self._spilled or cid in self._clean:  # on disk already: renamed, not written
            self._spilled.discard(cid)
            self._clean.discard(cid)
            self._spill_arena().rename(cid, _aside_key(cid))
        else:
            self._spill_arena().write(_aside_key(cid), self._memory[cid])
        return _SET_ASIDE

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("excluded"):  # from excluded_from_state_dicts: the store keeps its entries
            return
        for cid in self.ids():
            self._remove(cid)
        for cid, entry in state["entries"].items():
            if self._owns is None or self._owns(int(cid)):
                self.put(int(cid), entry)

    # --- memory and disk -----------------------------------------------------------------

    def _owned(self, client_id: int) -> int:
        cid = int(client_id)
        if self._owns is not None and not self._owns(cid):
            raise RuntimeError(
                f"Client {cid}'s state is kept by another process under client sharding; this rank reads and writes "
                "only the clients it trains."
            )
        return cid

    def _keep(self, cid: int, state: State) -> None:
        self._memory[cid] = state
        self._sizes[cid] = size = state_nbytes(state)
        self._resident += size
        self._fit_budget()

    def _remove(self, cid: int) -> None:
        self._discard(cid)
        self._revisions.pop(cid, None)

    def _discard(self, cid: int) -> None:
        if cid in self._memory:
            del self._memory[cid]
            self._resident -= self._sizes[cid]
            if cid in self._clean:
                self._clean.remove(cid)
                self._arena.free(cid)  # type: ignore[union-attr]
        elif cid in self._spilled:
            self._spilled.remove(cid)
            self._arena.free(cid)  # type: ignore[union-attr]
        self._sizes.pop(cid, None)

    def _fit_budget(self) -> None:
        while self._budget is not None and self._resident > self._budget and self._memory:
            self._spill_oldest()
        if _MALLOC_TRIM is not None and self._budget is not None and self._untrimmed > max(self._budget // _TRIM_EVERY, 1):
            # glibc keeps freed multi-MB blocks on its heap once its mmap threshold has grown: without this the
            # resident memory measured 2-3 times the budget (benchmarks/results/client_store.md). A trim costs
            # ~1 ms, so it runs once an eighth of the budget has been spilled since the last, not at every spill.
            _MALLOC_TRIM(0)
            self._untrimmed = 0

    def _spill_oldest(self) -> None:
        cid, state = self._memory.popitem(last=False)
        self._resident -= self._sizes[cid]
        self._untrimmed += self._sizes[cid]
        if cid in self._clean:  # its bytes are in the file already
            self._clean.remove(cid)
        else:
            self._spill_arena().write(cid, state)
        self._spilled.add(cid)

    def _spill_arena(self) -> SpillArena:
        """The store's spill file, made (with its folder) at the first use."""
        if self._arena is None:
            self._folder, lock = make_spill_folder(self._parent)
            self._arena = SpillArena(os.path.join(self._folder, "entries.bin"))
            weakref.finalize(self, _release, self._arena, self._folder, lock)
        return self._arena

    def __getstate__(self) -> dict[str, Any]:
        # A copy (deepcopy, pickling for spawned processes) holds every entry in memory, keeps the budget and
        # parent folder, and is bound to no process (its own spill folder, no sharding).
        state = dict(self.__dict__)
        state.update(_memory=OrderedDict(self.items()), _spilled=set(), _clean=set(), _resident=self.nbytes(), _folder=None, _arena=None)
        state.update(_owns=None, _gather=None, _reduce=None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._new_revisions()  # a copy that goes its own way must not reuse the original's revisions
        self._fit_budget()


#: :meth:`ClientStore.undo_changes`' mark of an entry set aside in the spill file.
_SET_ASIDE = "set aside"


def _aside_key(cid: int) -> int:
    """Where the spill file keeps client ``cid``'s entry set aside for an undo: a key no client id takes."""
    return -1 - cid


def _release(arena: SpillArena, folder: str, lock: int | None) -> None:
    """A store's finaliser: closes its arena and deletes its spill folder."""
    arena.close()
    release_spill_folder(folder, lock)


@contextlib.contextmanager
def excluded_from_state_dicts(stores: Iterable[ClientStore]) -> Iterator[None]:
    """Within it, ``stores`` give a mark in place of their entries from :meth:`ClientStore.state_dict` (and load it as
    a no-op): an algorithm's state without its per-client state, cheap to copy every round."""
    stores = list(stores)
    for store in stores:
        store._excluded = True
    try:
        yield
    finally:
        for store in stores:
            store._excluded = False


@contextlib.contextmanager
def recording_paused(stores: Iterable[ClientStore]) -> Iterator[None]:
    """Within it, :meth:`ClientStore.put` on ``stores`` is not recorded for :meth:`ClientStore.undo_changes`: a streamed
    round's client training between the folds of two updates, whose own writes (a personal model) a roll-back of the
    aggregation keeps, as it does when the clients train before the aggregation starts recording."""
    paused = [(store, store._undo) for store in stores]
    for store, _ in paused:
        store._undo = None
    try:
        yield
    finally:
        for store, undo in paused:
            store._undo = undo
