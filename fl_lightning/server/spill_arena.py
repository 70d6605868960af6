"""One file that holds a client store's spilled entries, each at its own byte range.

A file per client cost a file creation, a zip archive and an ``unlink`` per spill (about 1 ms of the
2.5 ms a spill and read-back took, ``benchmarks/results/client_store.md``); the arena writes an entry's
tensors' raw bytes with one ``pwritev`` and reads them back into fresh tensors with one ``preadv``. The range
an entry leaves is reused by the next entry of the same size (a store's entries are usually all the
same size: a client's control variate, model or moments); ranges of other sizes are reused once free
space exceeds the live entries, by compacting the entries to the front of the file.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import weakref
from dataclasses import dataclass

import torch
from torch import Tensor

from fl_lightning.server.model_state import State

#: Each tensor starts at a multiple of this many bytes, so that a byte buffer views as any dtype.
_ALIGN = 64
#: Free bytes (of sizes no entry reused) beyond which, and beyond the live entries', a new size compacts the file.
_COMPACT_ABOVE = 64 * 2**20
#: Every live mapping :meth:`SpillArena.map` handed out, for :func:`release_mapped_pages`.
_MAPPINGS: weakref.WeakSet[mmap.mmap] = weakref.WeakSet()


@dataclass(frozen=True)
class _Layout:
    """Where an entry is: its byte range, and each tensor's name, dtype, shape and offset in it."""

    offset: int
    size: int
    tensors: tuple[tuple[str, torch.dtype, torch.Size, int], ...]


def _aligned(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


class SpillArena:
    """Entries by client id in the file ``path`` (created, or truncated): :meth:`write`, :meth:`read`,
    :meth:`view`, :meth:`rename`, :meth:`free`, :meth:`close`."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        self._layouts: dict[int, _Layout] = {}
        self._free: dict[int, list[int]] = {}  # size -> offsets of free ranges of that size
        self._end = 0
        self._live = 0

    def write(self, cid: int, state: State) -> None:
        """Stores ``state`` (CPU tensors) as client ``cid``'s entry, replacing any earlier one."""
        self.free(cid)
        tensors, start = [], 0
        for name, t in state.items():
            tensors.append((name, t.dtype, t.shape, start))
            start += _aligned(t.numel() * t.element_size())
        layout = _Layout(0, max(start, _ALIGN), tuple(tensors))
        layout = _Layout(self._allocate(layout.size), layout.size, layout.tensors)
        os.pwritev(self._fd, _buffers(layout, [t.detach().contiguous() for t in state.values()]), layout.offset)
        self._layouts[cid] = layout
        self._live += layout.size

    def read(self, cid: int) -> State:
        """Client ``cid``'s entry, read into memory (bit for bit what :meth:`write` got), one tensor per storage."""
        layout = self._layouts[cid]
        state = {name: torch.empty(shape, dtype=dtype) for name, dtype, shape, _ in layout.tensors}
        os.preadv(self._fd, _buffers(layout, list(state.values())), layout.offset)
        return state

    def view(self, cid: int, mapped: mmap.mmap) -> State:
        """Client ``cid``'s entry as views of ``mapped`` (:meth:`map`), one storage per tensor: pages are read as
        they are touched."""
        layout = self._layouts[cid]
        return {
            name: torch.frombuffer(mapped, dtype=dtype, count=shape.numel(), offset=layout.offset + at).reshape(shape)
            if shape.numel()
            else torch.empty(shape, dtype=dtype)
            for name, dtype, shape, at in layout.tensors
        }

    def map(self) -> mmap.mmap | None:
        """A private (copy-on-write) mapping of the file for :meth:`view`; ``None`` while it is empty. Views stay
        valid while no entry is written or freed."""
        if not self._end:
            return None
        mapped = mmap.mmap(self._fd, self._end, access=mmap.ACCESS_COPY)
        _MAPPINGS.add(mapped)
        return mapped

    def rename(self, cid: int, new: int) -> None:
        """Files client ``cid``'s entry under ``new`` (replacing any entry there) without moving its bytes."""
        self.free(new)
        self._layouts[new] = self._layouts.pop(cid)

    def free(self, cid: int) -> None:
        """Forgets client ``cid``'s entry (if any); its range is reused."""
        layout = self._layouts.pop(cid, None)
        if layout is not None:
            self._free.setdefault(layout.size, []).append(layout.offset)
            self._live -= layout.size

    def close(self) -> None:
        os.close(self._fd)

    def _allocate(self, size: int) -> int:
        ranges = self._free.get(size)
        if ranges:
            return ranges.pop()
        if self._end - self._live > max(self._live, _COMPACT_ABOVE):
            self._compact()
        offset, self._end = self._end, self._end + size
        return offset

    def _compact(self) -> None:
        """Moves the live entries to the front of the file (in offset order); later entries follow them. The file
        keeps its size (truncating it under a live mapping would fault its readers)."""
        end = 0
        for cid, layout in sorted(self._layouts.items(), key=lambda item: item[1].offset):
            if layout.offset != end:
                data = os.pread(self._fd, layout.size, layout.offset)
                os.pwrite(self._fd, data, end)
                self._layouts[cid] = _Layout(end, layout.size, layout.tensors)
            end += layout.size
        self._end, self._free = end, {}


def _buffers(layout: _Layout, tensors: list[Tensor]) -> list[memoryview]:
    """The byte buffers that lay ``tensors`` (contiguous, CPU) out as ``layout`` says, padding between them."""
    buffers, end = [], 0
    for (_, _, _, at), t in zip(layout.tensors, tensors):
        if at > end:
            buffers.append(memoryview(bytearray(at - end)))
        raw = t.reshape(-1).view(torch.uint8).numpy()
        buffers.append(memoryview(raw))
        end = at + raw.nbytes
    if layout.size > end:
        buffers.append(memoryview(bytearray(layout.size - end)))
    return buffers


def release_mapped_pages() -> None:
    """Drops from this process the pages of every live :meth:`SpillArena.map` mapping that reading its views brought
    in (``madvise(MADV_DONTNEED)``; a view read again reads the file anew, the same bytes, since views are never
    written). A checkpoint save calls it after each shard, so that writing out a store mostly on disk does not count
    every spilled page in its resident memory (they are clean page cache, but ``ru_maxrss`` counts them)."""
    advice = getattr(mmap, "MADV_DONTNEED", None)
    if advice is None:  # a platform without madvise: the kernel still reclaims the pages under pressure
        return
    for mapped in list(_MAPPINGS):
        with contextlib.suppress(ValueError):  # closed meanwhile
            mapped.madvise(advice)
