"""Spill folders of killed runs: a SIGKILL or OOM kill skips every finaliser, so the folder a client store
spilled to stays on disk; the next fit in the same experiment folder removes it at start, and never a live one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from lightning.pytorch.loggers import CSVLogger

from fl_lightning import FederatedTrainer
from fl_lightning.data import Digits, Dirichlet, FederatedDataModule
from fl_lightning.models import MLP
from fl_lightning.server.client_store import ClientStore
from fl_lightning.server.spill_folder import PREFIX, sweep_orphan_spill_folders
from tests.algorithms.stateful import RunningMeanFedAvg
from tests.quiet import QUIET

pytest.importorskip("fcntl")

#: A fit that spills every entry (budget 0) and SIGKILLs itself as round 3 starts, after round 2's checkpoint.
_KILLED_RUN = """
import os, signal, sys
from lightning.pytorch import Callback
from tests.faults.test_spill_orphans import spilling_fit

class Kill(Callback):
    def on_train_epoch_start(self, trainer, module):
        if trainer.current_epoch == 2:
            print(trainer.algorithm.sums.spill_folder, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

spilling_fit(sys.argv[1], callbacks=[Kill()])
"""


def spilling_fit(root: str | Path, ckpt_path: str | None = None, callbacks: list | None = None) -> FederatedTrainer:
    """4 rounds of a stateful algorithm whose every entry spills (budget 0), logged under ``<root>/run``."""
    torch.manual_seed(0)
    data = FederatedDataModule(Digits(split="train"), partitioner=Dirichlet(alpha=0.5), num_clients=6, batch_size=16)
    trainer = FederatedTrainer(
        **{**QUIET, "logger": CSVLogger(root, name="run"), "callbacks": callbacks, "enable_checkpointing": True},
        algorithm=RunningMeanFedAvg(),
        clients_per_round=3,
        max_epochs=4,
        seed=1,
        client_state_memory=0,
        limit_val_batches=0,
    )
    trainer.fit(MLP(in_features=64, hidden=(16,), lr=0.1), datamodule=data, ckpt_path=ckpt_path)
    return trainer


def _spill_folders(parent: Path) -> list[Path]:
    return sorted(p for p in parent.iterdir() if p.name.startswith(PREFIX))


def test_a_killed_runs_spill_folder_is_removed_when_the_experiment_resumes(tmp_path: Path) -> None:
    repo = Path(__file__).resolve().parents[2]
    killed = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_KILLED_RUN), str(tmp_path)],
        cwd=repo,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(repo)},
        timeout=300,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    orphan = Path(killed.stdout.strip().splitlines()[-1])
    assert orphan.parent == tmp_path / "run" and (orphan / "entries.bin").stat().st_size > 0  # what the kill left

    checkpoint = tmp_path / "run" / "version_0" / "checkpoints" / "last.ckpt"
    resumed = spilling_fit(tmp_path, ckpt_path=str(checkpoint))
    assert not orphan.exists()
    assert _spill_folders(tmp_path / "run") == [Path(resumed.algorithm.sums.spill_folder)]  # only the live store's


def test_the_sweep_removes_dead_processes_folders_only(tmp_path: Path) -> None:
    live = ClientStore()
    live.bind(budget=0, folder=tmp_path)
    live.put(0, {"w": torch.ones(3)})
    script = (
        "import os, signal, sys, torch\n"
        "from fl_lightning.server.client_store import ClientStore\n"
        "store = ClientStore(); store.bind(budget=0, folder=sys.argv[1]); store.put(1, {'w': torch.ones(3)})\n"
        "print(store.spill_folder, flush=True); os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    killed = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, timeout=120)
    dead = killed.stdout.strip()
    unlocked = tmp_path / f"{PREFIX}unlocked"  # a kill between making a folder and locking it
    unlocked.mkdir()
    os.utime(unlocked, (0, 0))
    fresh = tmp_path / f"{PREFIX}fresh"  # ... or a live process about to lock it
    fresh.mkdir()

    assert sorted(sweep_orphan_spill_folders(str(tmp_path))) == sorted([dead, str(unlocked)])
    assert _spill_folders(tmp_path) == sorted([Path(live.spill_folder), fresh])
    assert torch.equal(live.get(0)["w"], torch.ones(3))  # the live store's entry is intact
    folder = live.spill_folder
    del live
    assert not os.path.exists(folder)  # removed with its store
