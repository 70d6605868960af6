"""Incremental checkpoints (issue 39): client-store entries go into shard files beside the round files, each entry
once per folder, and the round files reference them (``fl_lightning/checkpointing/client_shards.py``)."""

from __future__ import annotations

import os
import shutil
import warnings
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from fl_lightning import SCAFFOLD
from fl_lightning.checkpointing import newest_intact_checkpoint, round_checkpoint
from fl_lightning.checkpointing.checkpoint_io import CheckpointError, read_checkpoint
from fl_lightning.checkpointing import client_shards
from fl_lightning.checkpointing.client_shards import SHARD, referenced, split_shards
from fl_lightning.data import FederatedDataModule, InMemoryDataset
from fl_lightning.models import LogisticRegression
from fl_lightning.server.spill_arena import SpillArena, release_mapped_pages

from ..faults.aggregate_helpers import same, tiny_trainer
from ..faults.corrupt import flip_tensor_byte

#: 8 clients of 40 samples, 512 features: a SCAFFOLD control variate is 1,026 float32 values (4,104 bytes).
CLIENTS, FEATURES = 8, 512


def data() -> FederatedDataModule:
    g = torch.Generator().manual_seed(0)
    n = CLIENTS * 40
    train = InMemoryDataset(inputs=torch.randn(n, FEATURES, generator=g), labels=torch.randint(0, 2, (n,), generator=g), num_classes=2)
    test = InMemoryDataset(inputs=torch.randn(8, FEATURES, generator=g), labels=torch.randint(0, 2, (8,), generator=g), num_classes=2)
    return FederatedDataModule(train, test, num_clients=CLIENTS, batch_size=20)


def fit(
    folder: Path, rounds: int, *, ckpt_path: Any = None, callbacks: tuple[pl.Callback, ...] = (), **trainer_args: Any
) -> tuple[torch.nn.Module, Any]:
    """SCAFFOLD on :func:`data`, checkpointing every round into ``folder/checkpoints``."""
    torch.manual_seed(0)
    model = LogisticRegression(in_features=FEATURES, num_classes=2, lr=0.1)
    trainer = tiny_trainer(
        algorithm=SCAFFOLD(), clients_per_round=2, max_epochs=rounds, seed=3, enable_checkpointing=True, logger=False,
        default_root_dir=folder, callbacks=[round_checkpoint(), *callbacks], **trainer_args,
    )  # fmt: skip
    trainer.fit(model, datamodule=data(), ckpt_path=ckpt_path)
    return model, trainer


class ShardsWritten(pl.Callback):
    """The round after which each shard file of ``folder`` first appeared."""

    def __init__(self, folder: Path) -> None:
        self.folder, self.round_of = folder, {}

    def _look(self, round_idx: int) -> None:
        for name in os.listdir(self.folder) if self.folder.exists() else []:
            if SHARD.fullmatch(name):
                self.round_of.setdefault(name, round_idx)

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._look(trainer.current_epoch - 1)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._look(trainer.current_epoch - 1)


def shards(folder: Path) -> set[str]:
    return {name for name in os.listdir(folder) if SHARD.fullmatch(name)}


def entries(trainer: Any) -> dict[int, dict[str, torch.Tensor]]:
    return {cid: dict(entry) for cid, entry in trainer.algorithm.client_controls.items()}


def same_entries(a: dict[int, dict[str, torch.Tensor]], b: dict[int, dict[str, torch.Tensor]]) -> bool:
    return a.keys() == b.keys() and all(same(a[cid], b[cid]) for cid in a)


def test_a_resumed_incremental_run_equals_the_uninterrupted_one(tmp_path: Path) -> None:
    reference, uninterrupted = fit(tmp_path / "reference", 5)
    fit(tmp_path / "run", 3)
    assert referenced(tmp_path / "run" / "checkpoints" / "last.ckpt")  # the entries are in shards, not inline
    resumed, trainer = fit(tmp_path / "run", 5, ckpt_path="last")
    assert trainer.fit_loop.history[:3] == uninterrupted.fit_loop.history[:3]
    assert same(resumed.state_dict(), reference.state_dict())
    assert same(trainer.algorithm.control, uninterrupted.algorithm.control)
    assert same_entries(entries(trainer), entries(uninterrupted))


def test_a_round_writes_only_the_entries_it_changed(tmp_path: Path) -> None:
    folder = tmp_path / "checkpoints"
    written = ShardsWritten(folder)
    _, trainer = fit(tmp_path, 4, callbacks=(written,))
    store = trainer.algorithm.client_controls
    entry_bytes = store.nbytes() // len(store)
    last = {name for name, r in written.round_of.items() if r == 3}
    assert len(last) == 1 and len(store) > 2
    (shard,) = last
    refs = read_refs(folder / "round_3.ckpt")
    assert {cid for cid, (name, _) in refs.items() if name == shard} == set(trainer.fit_loop.history[3])
    assert len(torch.load(folder / shard, weights_only=True)) == 2
    # On disk: the round's 2 entries and the archive's own bytes, not the store's 8 entries.
    assert 2 * entry_bytes <= os.path.getsize(folder / shard) < 3 * entry_bytes


def read_refs(path: Path) -> dict[int, list[str]]:
    algorithm = torch.load(path, weights_only=True)["loops"]["fit_loop"]["state_dict"]["federated"]["algorithm"]
    assert "entries" not in algorithm["client_controls"]
    return algorithm["client_controls"]["shards"]


@pytest.mark.parametrize("damage", ["missing", "corrupt"])
def test_a_round_with_a_missing_or_corrupt_shard_falls_back_to_the_round_before(tmp_path: Path, damage: str) -> None:
    reference, _ = fit(tmp_path / "reference", 5)
    folder = tmp_path / "run" / "checkpoints"
    fit(tmp_path / "run", 4)
    (newest,) = referenced(folder / "round_3.ckpt") - referenced(folder / "round_2.ckpt")
    if damage == "missing":
        os.remove(folder / newest)
    else:
        flip_tensor_byte(folder / newest)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resumed, trainer = fit(tmp_path / "run", 5, ckpt_path="last")
    naming = [str(w.message) for w in caught if newest in str(w.message)]
    assert len(naming) == 1 and f"resuming from {folder / 'round_2.ckpt'}" in naming[0]
    assert trainer.ckpt_path == str(folder / "round_2.ckpt")
    assert same(resumed.state_dict(), reference.state_dict())


def test_shards_of_removed_rounds_are_deleted_and_referenced_ones_kept(tmp_path: Path) -> None:
    folder = tmp_path / "checkpoints"
    written = ShardsWritten(folder)
    fit(tmp_path, 6, callbacks=(written,))
    kept = referenced(folder / "round_4.ckpt") | referenced(folder / "round_5.ckpt")
    assert shards(folder) == kept
    assert set(written.round_of) - kept  # some were deleted ...
    assert any(written.round_of[name] < 4 for name in kept)  # ... and an older one that a kept round references stays


def test_a_user_checkpoint_in_another_folder_gets_its_own_shards(tmp_path: Path) -> None:
    # mode="max" (no monitor: no effect) only sets its state key apart from the round checkpoints' callback's.
    user = ModelCheckpoint(dirpath=tmp_path / "user", every_n_epochs=1, save_top_k=-1, filename="{epoch}", mode="max")
    _, trainer = fit(tmp_path / "run", 3, callbacks=(user,))
    assert shards(tmp_path / "run" / "checkpoints")
    shutil.rmtree(tmp_path / "run")  # the user's checkpoints reference no shard of the round checkpoints' folder
    assert shards(tmp_path / "user")
    saved = read_checkpoint(tmp_path / "user" / "epoch=2.ckpt")["loops"]["fit_loop"]["state_dict"]["federated"]
    assert same_entries(saved["algorithm"]["client_controls"]["entries"], entries(trainer))


def test_read_checkpoint_and_trainer_test_resolve_the_references(tmp_path: Path) -> None:
    model, trainer = fit(tmp_path, 2)
    last = tmp_path / "checkpoints" / "last.ckpt"
    saved = read_checkpoint(last)["loops"]["fit_loop"]["state_dict"]["federated"]["algorithm"]["client_controls"]
    assert set(saved) == {"entries"} and same_entries(saved["entries"], entries(trainer))
    trainer.test(model, datamodule=data(), ckpt_path=str(last))
    for name in referenced(last):
        os.remove(tmp_path / "checkpoints" / name)
    with pytest.raises(CheckpointError, match=r"client shard .*clients-\d+-[0-9a-f]+\.pt is missing"):
        read_checkpoint(last)
    with pytest.raises(CheckpointError, match=r"client shard .*clients-\d+-[0-9a-f]+\.pt is missing"):
        trainer.test(model, datamodule=data(), ckpt_path=str(last))


class Killed(BaseException):
    """Stands for SIGKILL: no ``except Exception`` on the way out catches it."""


def test_a_kill_between_the_shard_and_the_round_file_resumes_bit_exact_and_sweeps_the_shard(tmp_path: Path) -> None:
    reference, _ = fit(tmp_path / "reference", 4)
    folder = tmp_path / "run" / "checkpoints"
    replace = os.replace

    def killed_at_round_2(src: Any, dst: Any) -> None:
        if os.path.basename(dst) == "round_2.ckpt":  # the round's shard is already in place
            raise Killed(dst)
        replace(src, dst)

    with pytest.MonkeyPatch.context() as patch, pytest.raises(Killed):
        patch.setattr(os, "replace", killed_at_round_2)
        fit(tmp_path / "run", 4)
    used = set().union(*(referenced(path) for path in folder.glob("*.ckpt")))
    (orphan,) = shards(folder) - used
    assert os.path.realpath(newest_intact_checkpoint(folder)) == str(folder / "round_1.ckpt")
    resumed, _ = fit(tmp_path / "run", 4, ckpt_path="last")
    assert not (folder / orphan).exists()
    assert same(resumed.state_dict(), reference.state_dict())


def store_checkpoint(revisions: dict[int, str]) -> dict[str, Any]:
    """A checkpoint whose one store holds a 10-value float32 entry (40 bytes) per client, at these revisions."""
    store = {"entries": {cid: {"c": torch.full((10,), float(cid))} for cid in revisions}, "revisions": revisions}
    return {"loops": {"fit_loop": {"state_dict": {"federated": {"algorithm": {"client_controls": store}}}}}}


@pytest.mark.parametrize(("superseded", "compacted"), [(1, False), (3, True)])
def test_shards_mostly_superseded_are_compacted_into_the_new_one(tmp_path: Path, superseded: int, compacted: bool) -> None:
    old = "clients-1-00.pt"
    (tmp_path / old).write_bytes(b"")
    # The old shard holds client 0's current entry and `superseded` entries no store holds any more.
    written = {"s-0": (old, 40), **{f"gone-{i}": (old, 40) for i in range(superseded)}}
    checkpoint = store_checkpoint({0: "s-0", 1: "s-1"})
    referencing, shards = split_shards(checkpoint, str(tmp_path), written)
    # Not compacted, the round references 40 + 40 x superseded old bytes plus its own 40: at most 2 x its 80 bytes.
    ((name, new),) = shards.items()
    assert set(new) == ({"s-0", "s-1"} if compacted else {"s-1"})
    refs = referencing["loops"]["fit_loop"]["state_dict"]["federated"]["algorithm"]["client_controls"]["shards"]
    assert refs == {0: [name if compacted else old, "s-0"], 1: [name, "s-1"]}
    assert "entries" in checkpoint["loops"]["fit_loop"]["state_dict"]["federated"]["algorithm"]["client_controls"]
    os.remove(tmp_path / old)  # a shard that is gone is written again
    ((_, rewritten),) = split_shards(checkpoint, str(tmp_path), written)[1].items()
    assert set(rewritten) == {"s-0", "s-1"} and not written


def test_a_save_cuts_its_new_entries_into_shards_of_bounded_size(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(client_shards, "SHARD_BYTES", 100)  # the entries are 40 bytes: 3 to a shard
    checkpoint = store_checkpoint({cid: f"s-{cid}" for cid in range(7)})
    referencing, shards = split_shards(checkpoint, str(tmp_path), {})
    assert [sorted(entries) for entries in shards.values()] == [["s-0", "s-1", "s-2"], ["s-3", "s-4", "s-5"], ["s-6"]]
    refs = referencing["loops"]["fit_loop"]["state_dict"]["federated"]["algorithm"]["client_controls"]["shards"]
    assert all(rev in shards[name] for name, rev in refs.values())


def test_a_run_whose_saves_span_several_shards_resumes_bit_exact(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Each entry its own shard, the store spilled to disk (views of the spill file, whose pages each shard releases).
    monkeypatch.setattr(client_shards, "SHARD_BYTES", 1)
    reference, uninterrupted = fit(tmp_path / "reference", 4)
    fit(tmp_path / "run", 2, client_state_memory=0)
    folder = tmp_path / "run" / "checkpoints"
    assert len({name for name, _ in read_refs(folder / "last.ckpt").values()}) > 2
    resumed, trainer = fit(tmp_path / "run", 4, ckpt_path="last", client_state_memory=0)
    assert same(resumed.state_dict(), reference.state_dict())
    assert same_entries(entries(trainer), entries(uninterrupted))


def test_released_pages_read_back_the_same_bytes(tmp_path: Path) -> None:
    arena = SpillArena(str(tmp_path / "entries.bin"))
    arena.write(0, {"c": torch.arange(100_000, dtype=torch.float32)})
    view = arena.view(0, arena.map())
    before = view["c"].clone()
    release_mapped_pages()
    assert torch.equal(view["c"], before)
    arena.close()
