"""Incremental checkpoints: client-store entries written once per folder, in shard files the round files reference.

A round changes the entries of the clients it trained (SCAFFOLD: 500 of 5,000 control variates), but an inline
checkpoint rewrites every entry each round. A :class:`~fl_lightning.server.client_store.ClientStore` gives each
entry a new revision at every ``put`` and saves the revisions beside the entries; :class:`CheckedCheckpointIO
<fl_lightning.checkpointing.checkpoint_io.CheckedCheckpointIO>` then writes the entries whose revision it has not
yet written to that folder into new shards, ``clients-<pid>-<uuid>.pt`` (``{revision: entry}``), *before* the
round file, which holds ``{"shards": {client: [shard, revision]}}`` in place of each store's entries. The round
file's rename stays the only commit: a kill before it leaves an unreferenced shard, never a round whose entries are
missing. Reading a checkpoint puts the entries back (:func:`resolve_shards`), after checking each shard whole; a
round whose shard is missing or corrupt is not intact (:func:`shards_problem`), so the resume falls back to the
round before. A save's new entries go into shards of at most about :data:`SHARD_BYTES` each; after each one is
written, the pages of the memory-mapped spill files it read are dropped from this process
(:func:`~fl_lightning.server.spill_arena.release_mapped_pages`), so a first save of a store mostly on disk holds no
more than one shard's pages resident. A shard no ``*.ckpt`` of its folder references is deleted (:func:`unreferenced_shards`) once the
round files that did are removed. A checkpoint copied elsewhere needs its shards beside it.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

from fl_lightning.checkpointing.integrity import CheckpointError, integrity_problem, one_line
from fl_lightning.server.model_state import State

#: A shard's file name: the writer's process id (a start-up sweep keeps a live writer's) and a random id.
SHARD = re.compile(r"clients-(\d+)-[0-9a-f]+\.pt")
#: When the shards a save would reference hold more than this many times the bytes of its entries (most of their
#: entries superseded), it writes every entry into new shards instead, so that the old ones can be deleted.
COMPACT_ABOVE = 2.0
#: A save starts a new shard once its current one holds this many bytes of entries.
SHARD_BYTES = 64 * 2**20


def new_shard_name() -> str:
    """A fresh shard file name of this process."""
    return f"clients-{os.getpid()}-{uuid.uuid4().hex[:16]}.pt"


def split_shards(
    checkpoint: dict[str, Any], folder: str, written: dict[str, tuple[str, int]]
) -> tuple[dict[str, Any], dict[str, dict[str, State]]]:
    """``checkpoint`` with references in place of each store's entries, and the new shards to write (name -> their
    entries by revision, each about :data:`SHARD_BYTES` at most: a single entry may exceed it). ``written`` (revision ->
    the shard of ``folder`` that holds it, and its bytes) names the entries already on disk; those whose shard is gone
    are dropped from it. ``checkpoint`` itself is left as it is.

    Every entry goes into new shards when the shards to be reused are mostly superseded (:data:`COMPACT_ABOVE`).
    """
    stores = list(_stores(checkpoint.get("loops"), _has_revisions))
    if not stores:
        return checkpoint, {}
    present = {shard: os.path.exists(os.path.join(folder, shard)) for shard, _ in written.values()}
    for revision in [r for r, (shard, _) in written.items() if not present[shard]]:
        del written[revision]
    sizes = {state["revisions"][cid]: entry_nbytes(entry) for state in stores for cid, entry in state["entries"].items()}
    reused = {rev: written[rev][0] for rev in sizes if rev in written}
    kept = set(reused.values())
    old = sum(size for shard, size in written.values() if shard in kept)
    total = sum(sizes.values())
    if old + total - sum(sizes[rev] for rev in reused) > COMPACT_ABOVE * total:
        reused = {}
    new: dict[str, dict[str, State]] = {}
    filled = SHARD_BYTES  # bytes in the newest shard: full, so that the first new entry starts one

    def shard_for(rev: str) -> str:
        nonlocal filled
        if filled >= SHARD_BYTES:
            new[new_shard_name()], filled = {}, 0
        filled += sizes[rev]
        return next(reversed(new))

    def reference(state: Mapping[str, Any]) -> dict[str, Any]:
        shards = {}
        for cid, entry in state["entries"].items():
            rev = state["revisions"][cid]
            if rev in reused:
                shards[cid] = [reused[rev], rev]
            else:
                shards[cid] = [shard := shard_for(rev), rev]
                new[shard][rev] = entry
        return {**{k: v for k, v in state.items() if k not in ("entries", "revisions")}, "shards": shards}

    return {**checkpoint, "loops": _replaced(checkpoint["loops"], _has_revisions, reference)}, new


def resolve_shards(checkpoint: dict[str, Any], path: Any, map_location: Any | None = None) -> dict[str, Any]:
    """``checkpoint`` (read from ``path``) with each store's referenced entries put back (``{"entries": ...}``), read
    memory-mapped from the shards beside it after checking each whole; unchanged when it references none.

    Raises:
        CheckpointError: naming the shard when it is missing, corrupt, or lacks an entry the checkpoint references.
    """
    if "loops" not in checkpoint or next(_stores(checkpoint["loops"], _has_shards), None) is None:
        return checkpoint
    folder = os.path.dirname(os.path.abspath(path))
    loaded: dict[str, Mapping[str, State]] = {}

    def entries(state: Mapping[str, Any]) -> dict[str, Any]:
        resolved = {}
        for cid, (shard, rev) in state["shards"].items():
            if shard not in loaded:
                loaded[shard] = _load_shard(os.path.join(folder, shard), path, map_location)
            if rev not in loaded[shard]:
                raise CheckpointError(
                    f"{os.path.join(folder, shard)} lacks client {cid}'s entry (revision {rev}) that checkpoint {path} "
                    "references: it was altered or replaced."
                )
            resolved[cid] = loaded[shard][rev]
        return {**{k: v for k, v in state.items() if k != "shards"}, "entries": resolved}

    return {**checkpoint, "loops": _replaced(checkpoint["loops"], _has_shards, entries)}


def _load_shard(shard: str, path: Any, map_location: Any | None) -> Mapping[str, State]:
    problem = shards_missing_or_corrupt([shard])
    if problem is not None:
        raise CheckpointError(f"Cannot read the client entries of checkpoint {path}: {problem}; copy the intact shard beside it.")
    try:
        loaded = torch.load(shard, map_location=map_location, weights_only=True, mmap=True)
    except Exception as err:
        raise CheckpointError(f"Cannot read client shard {shard} of checkpoint {path} ({type(err).__name__}: {one_line(str(err))}).") from err
    if not isinstance(loaded, Mapping):
        raise CheckpointError(f"{shard} is not a client shard (found {type(loaded).__name__}).")
    return loaded


def referenced(path: str | os.PathLike[str]) -> set[str] | None:
    """The shard names the checkpoint at ``path`` references (empty: none), or ``None`` when it cannot be read."""
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:
        return None
    loops = checkpoint.get("loops") if isinstance(checkpoint, Mapping) else None
    return {shard for state in _stores(loops, _has_shards) for shard, _ in state["shards"].values()}


def shards_problem(path: str | os.PathLike[str]) -> str | None:
    """What is wrong with the shards the (whole) checkpoint at ``path`` references, in a few words naming the first
    missing or corrupt one; ``None`` when they are whole, or the checkpoint cannot be read here (its load says why)."""
    names = referenced(path)
    folder = os.path.dirname(os.path.abspath(path))
    return None if not names else shards_missing_or_corrupt(os.path.join(folder, n) for n in sorted(names))


def shards_missing_or_corrupt(shards: Any) -> str | None:
    """The first of ``shards`` (paths) that is missing or not whole, and why; ``None`` when all are whole."""
    for shard in shards:
        if not os.path.exists(shard):
            return f"its client shard {shard} is missing"
        problem = integrity_problem(shard)
        if problem is not None:
            return f"its client shard {shard} is corrupt ({problem})"
    return None


def unreferenced_shards(folder: str | os.PathLike[str]) -> list[str] | None:
    """The shard files in ``folder`` that no ``*.ckpt`` there references, or ``None`` when a checkpoint there cannot be
    read (then nothing is known to be unreferenced)."""
    try:
        names = os.listdir(folder)
    except (FileNotFoundError, NotADirectoryError):
        return []
    shards = [n for n in names if SHARD.fullmatch(n)]
    if not shards:
        return []
    used: set[str] = set()
    for name in names:
        path = os.path.join(folder, name)
        if name.endswith(".ckpt") and not name.startswith(".") and os.path.isfile(path):
            found = referenced(path)
            if found is None:
                return None
            used |= found
    return [os.path.join(folder, n) for n in shards if n not in used]


def shard_writer(path: str) -> int:
    """The process id in a shard file's name."""
    match = SHARD.fullmatch(os.path.basename(path))
    assert match is not None
    return int(match.group(1))


def _has_revisions(state: Mapping[str, Any]) -> bool:
    return "entries" in state and isinstance(state.get("revisions"), Mapping)


def _has_shards(state: Mapping[str, Any]) -> bool:
    return isinstance(state.get("shards"), Mapping) and "entries" not in state


def entry_nbytes(entry: State) -> int:
    """Bytes of an entry's tensors."""
    return sum(t.numel() * t.element_size() for t in entry.values())


def _stores(value: Any, matches: Callable[[Mapping[str, Any]], bool]) -> Iterator[Mapping[str, Any]]:
    """The store states nested in ``value``'s mappings that ``matches``."""
    if isinstance(value, Mapping):
        if matches(value):
            yield value
        else:
            for item in value.values():
                yield from _stores(item, matches)


def _replaced(value: Any, matches: Callable[[Mapping[str, Any]], bool], replace: Callable[[Mapping[str, Any]], Any]) -> Any:
    """``value`` with each nested store state that ``matches`` replaced; mappings with nothing replaced are kept."""
    if not isinstance(value, Mapping):
        return value
    if matches(value):
        return replace(value)
    items = {key: _replaced(item, matches, replace) for key, item in value.items()}
    return value if all(items[key] is value[key] for key in value) else items
