"""Issue 25: a run killed at any write point of its checkpoints resumes with ``ckpt_path="last"``
to the uninterrupted run's weights, bit for bit, having lost at most the round being saved.

Every file-system call that writes a checkpoint (``fsync`` of the temp file and of the folder, the
rename over ``round_<r>.ckpt``, the link swap of ``last.ckpt``, the removal of the previous round's
file) is a write point; the kill is a ``BaseException`` raised just before or just after it, which
leaves the disk as a ``kill -9`` there would (nothing else writes checkpoints on the way out). A
kill before the temp write leaves the disk as the previous write point's "after" does, and a kill
during it leaves a partial temp file, which :func:`~fl_lightning.checkpointing.newest_intact_checkpoint`
never reads (``.round_<r>.ckpt.<pid>.tmp``, also checked below).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch

from fl_lightning import SCAFFOLD, FedAvg, FedBuff, ServerAdam
from fl_lightning.algorithms.shared.algorithm import Algorithm
from fl_lightning.checkpointing import newest_intact_checkpoint, round_checkpoint
from fl_lightning.checkpointing.client_shards import unreferenced_shards
from fl_lightning.participation import ConstantDelay

from .aggregate_helpers import same, tiny_data, tiny_model, tiny_trainer

ROUNDS = 3
#: The calls that change what a checkpoint folder holds, or make it durable.
WRITE_CALLS = ("fsync", "replace", "symlink", "remove")
ALGORITHMS: dict[str, Callable[[], Algorithm]] = {
    "fedavg_adam": lambda: FedAvg(server_optimizer=ServerAdam(lr=0.05)),  # server moments in the checkpoint
    "fedbuff": lambda: FedBuff(buffer_size=2, delays=ConstantDelay(1.0)),  # async events in flight
    "scaffold": SCAFFOLD,  # per-client state: a shard of the round's entries is written before the round's file
}


class Killed(BaseException):
    """Stands for SIGKILL: no ``except Exception`` on the way out catches it."""


@contextmanager
def kill_at(point: int | None) -> Iterator[list[str]]:
    """Counts the write points of ``os`` calls (before and after each) and raises :class:`Killed`
    at the ``point``-th (never for ``None``); yields the list of points passed, by name."""
    passed: list[str] = []
    originals = {name: getattr(os, name) for name in WRITE_CALLS}

    def mark(label: str) -> None:
        if len(passed) == point:
            raise Killed(label)
        passed.append(label)

    def wrapped(name: str) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            mark(f"before {name}")
            result = originals[name](*args, **kwargs)
            mark(f"after {name}")
            return result

        return call

    with pytest.MonkeyPatch.context() as patch:
        for name in WRITE_CALLS:
            patch.setattr(os, name, wrapped(name))
        yield passed


def fit(folder: Path, algorithm: str, *, ckpt_path: str | None = None) -> tuple[torch.nn.Module, Any]:
    model = tiny_model()
    trainer = tiny_trainer(
        max_epochs=ROUNDS, algorithm=ALGORITHMS[algorithm](), clients_per_round=2, seed=3,
        enable_checkpointing=True, logger=False, default_root_dir=folder,
        callbacks=[round_checkpoint()],  # every round, FedBuff's aggregations too (not every 60 s)
    )
    trainer.fit(model, datamodule=tiny_data(), ckpt_path=ckpt_path)
    return model, trainer


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_a_kill_at_any_write_point_resumes_bit_exact(tmp_path: Path, algorithm: str) -> None:
    with kill_at(None) as points:
        reference, _ = fit(tmp_path / "reference", algorithm)
    # Every save: (the shard: fsync temp, rename, fsync folder,) fsync temp, rename, fsync folder; link swap: rename,
    # fsync folder; removal of the previous round (and of the shards no round references any more).
    renames = 3 if algorithm == "scaffold" else 2
    assert points.count("before replace") == renames * ROUNDS and points.count("before symlink") == ROUNDS
    for point, label in enumerate(points):
        folder = tmp_path / f"kill_{point}"
        with pytest.raises(Killed), kill_at(point):
            fit(folder, algorithm)
        resume_from = newest_intact_checkpoint(folder / "checkpoints")  # read now: the resumed run removes old rounds
        done = rounds_done(resume_from)
        resumed, trainer = fit(folder, algorithm, ckpt_path="last")
        assert trainer.ckpt_path == resume_from
        assert same(resumed.state_dict(), reference.state_dict()), f"killed {label} (write point {point})"
        # Each save renames twice (the round's file, then the link) or three times (a shard first): at most the
        # round being saved is lost.
        linked = points[:point].count("after replace") // renames
        assert done >= linked, f"killed {label} (write point {point}): resumed from {resume_from}"
        # A shard whose round file was never renamed into place is swept (the resumed fit's start, or its removals).
        assert unreferenced_shards(folder / "checkpoints") == [], f"killed {label} (write point {point})"


def rounds_done(path: str | None) -> int:
    if path is None:  # nothing saved yet: the run started again from round 0
        return 0
    return torch.load(path, weights_only=False)["loops"]["fit_loop"]["state_dict"]["federated"]["rounds_done"]


def test_a_partial_temp_file_is_never_read(tmp_path: Path) -> None:
    _, trainer = fit(tmp_path, "fedavg_adam")
    checkpoints = tmp_path / "checkpoints"
    whole = (checkpoints / f"round_{ROUNDS - 1}.ckpt").read_bytes()
    (checkpoints / f".round_{ROUNDS}.ckpt.123.tmp").write_bytes(whole[: len(whole) // 2])
    os.remove(checkpoints / "last.ckpt")
    with pytest.warns(UserWarning, match=r"last\.ckpt is missing: resuming from .*round_2\.ckpt"):
        resumed, _ = fit(tmp_path, "fedavg_adam", ckpt_path="last")
    assert same(resumed.state_dict(), trainer.lightning_module.state_dict())


def test_fit_start_sweeps_the_temp_files_of_dead_writers_only(tmp_path: Path) -> None:
    """Issue 39 item 12: a SIGKILL during a save leaves ``.round_N.ckpt.<pid>.tmp``; the next fit removes it,
    and keeps the temp file of a writer that is still alive."""
    import signal
    import subprocess
    import sys

    fit(tmp_path, "fedavg_adam")
    killed = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    checkpoints = tmp_path / "checkpoints"
    orphan = checkpoints / f".round_{ROUNDS}.ckpt.{killed.pid}.tmp"
    live = checkpoints / f".round_{ROUNDS}.ckpt.{os.getppid()}.tmp"
    for path in (orphan, live):
        path.write_bytes(b"partial")
    fit(tmp_path, "fedavg_adam", ckpt_path="last")
    assert not orphan.exists() and live.exists()
    assert not [p.name for p in checkpoints.iterdir() if p.name.endswith(".tmp") and p != live]
