"""SpillArena: one file for a store's spilled entries, read back bit for bit, ranges reused, compacted."""

from __future__ import annotations

import os

import torch

from fl_lightning.server.spill_arena import SpillArena


def _entry(seed: int, n: int = 10) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "w": torch.randn(n, 3, generator=g),
        "half": torch.randn(5, generator=g).to(torch.bfloat16),
        "double": torch.randn((), generator=g, dtype=torch.float64),
        "mask": torch.rand(7, generator=g) > 0.5,
        "count": torch.randint(-(2**40), 2**40, (2,), generator=g),
        "empty": torch.empty(0, 4),
        "strided": torch.randn(4, 6, generator=g).t(),
    }


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert list(a) == list(b)
    for name in a:
        assert a[name].dtype == b[name].dtype and a[name].shape == b[name].shape and torch.equal(a[name], b[name]), name


def test_every_dtype_and_shape_comes_back_bit_for_bit_read_or_mapped(tmp_path):
    arena = SpillArena(str(tmp_path / "entries.bin"))
    for cid in range(5):
        arena.write(cid, _entry(cid))
    mapped = arena.map()
    for cid in range(5):
        _same(arena.read(cid), _entry(cid))
        _same(arena.view(cid, mapped), _entry(cid))
    arena.close()


def test_a_rewritten_entry_of_the_same_size_reuses_its_range(tmp_path):
    path = tmp_path / "entries.bin"
    arena = SpillArena(str(path))
    for cid in range(4):
        arena.write(cid, _entry(cid))
    size = os.path.getsize(path)
    for step in range(20):
        cid = step % 4
        arena.free(cid)
        arena.write(cid, _entry(100 + step))
    assert os.path.getsize(path) == size
    for cid in range(4):
        _same(arena.read(cid), _entry(100 + 16 + cid))


def test_ranges_of_other_sizes_are_compacted_and_entries_stay_exact(tmp_path, monkeypatch):
    path = tmp_path / "entries.bin"
    arena = SpillArena(str(path))
    for cid in range(8):
        arena.write(cid, _entry(cid, n=1000))  # ~12 kB each
    for cid in (0, 2, 4, 6, 7):
        arena.free(cid)
    before = os.path.getsize(path)
    monkeypatch.setattr("fl_lightning.server.spill_arena._COMPACT_ABOVE", 0)
    arena.write(20, _entry(20, n=2000))  # no free range of its size, most of the file free: compacts first
    assert os.path.getsize(path) <= before  # written into the space compaction freed
    for cid in (1, 3, 5):
        _same(arena.read(cid), _entry(cid, n=1000))
    _same(arena.read(20), _entry(20, n=2000))
