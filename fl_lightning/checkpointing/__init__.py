"""Checkpoints of a federated run: one per round, named by round, with the global model.

* :func:`round_checkpoint` is the ``ModelCheckpoint`` that :class:`~fl_lightning.FederatedTrainer`
  installs when checkpointing is on and none is given: after every round (for an asynchronous
  algorithm, whose aggregations are cheap, after the first aggregation that ends at least
  :data:`ASYNC_EVERY_S` after the previous save, and after the last), whatever
  ``check_val_every_n_epoch``, it writes ``round_<r>.ckpt``
  (``r`` the 0-based round, as in the logs' ``round`` column) atomically, links ``last.ckpt`` to
  it, and only then removes the previous round's file: a crash at any point leaves an intact one.
* :func:`find_last_checkpoint` resolves ``ckpt_path="last"``: this run's own folder, else the
  experiment's newest run (each run of a logger gets a new version folder, where Lightning alone
  would look); in it ``last.ckpt``, or when that is missing, dangling or truncated the newest
  intact ``round_<r>.ckpt`` (:func:`newest_intact_checkpoint`).
* :func:`run_directory` is the run's own folder of its first logger, which holds ``checkpoints/``.
* :class:`GlobalModelCheckpoint` makes every checkpoint's ``state_dict`` the global model, also
  when it is saved mid-round (the module then holds a client's weights, which go into the
  loop's state), so ``load_from_checkpoint`` returns the global model.
"""

from __future__ import annotations

import contextlib
import glob
import math
import os
import re
import time
import zipfile
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from typing_extensions import override

from fl_lightning.checkpointing.checkpoint_io import sweep_orphan_temp_files, sync_folder

#: The file name of each round's checkpoint (``round_3.ckpt``: the model after 0-based round 3).
ROUND_FILENAME = "round_{epoch}"
#: Seconds of work an asynchronous run may lose to a crash: its checkpoint cadence. An aggregation
#: can take milliseconds while a checkpoint takes tens (its simulation state grows with the run),
#: so saving every one would cost more than the training.
ASYNC_EVERY_S = 60.0


class RoundCheckpoint(ModelCheckpoint):
    """:func:`round_checkpoint`'s class. Resumed into a new version folder (each run of a logger
    gets one), it reloads ``best_model_path`` alone, as ``ModelCheckpoint`` does, but without its
    "dirpath has changed" warning: with no monitor there is no best-k bookkeeping to lose.

    Unlike ``ModelCheckpoint``, which removes the previous round's file before it relinks
    ``last.ckpt`` (a crash in between leaves ``last.ckpt`` dangling), it swaps the link atomically
    and removes superseded files only once ``last.ckpt`` points to the new one.

    Args:
        every_s: save at the end of a round only once this many seconds have passed since the
            previous save (and always after the first and the last round); ``0``: every round.
        **kwargs: ``ModelCheckpoint``'s arguments; by default the file is ``round_<r>.ckpt``, saved
            at the end of the round (not at validation, which ``check_val_every_n_epoch`` may skip),
            with ``last.ckpt`` linked to it.
    """

    def __init__(self, *, every_s: float = 0.0, **kwargs: Any) -> None:
        if isinstance(every_s, bool) or not isinstance(every_s, (int, float)) or not 0 <= every_s < math.inf:
            raise ValueError(f"`every_s` must be a finite number of seconds >= 0, got {every_s!r}.")
        defaults = {
            "filename": ROUND_FILENAME,
            "auto_insert_metric_name": False,
            "save_last": "link",
            "every_n_epochs": 1,
            "save_on_train_epoch_end": True,
        }
        super().__init__(**{**defaults, **kwargs})
        self.every_s = float(every_s)
        self._saved_at: float | None = None
        self._superseded: list[str] = []

    @override
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.every_s:
            max_epochs = trainer.max_epochs
            last_round = trainer.should_stop or (max_epochs is not None and trainer.current_epoch + 1 >= max_epochs)
            due = self._saved_at is None or last_round or time.monotonic() - self._saved_at >= self.every_s
            if not trainer.strategy.broadcast(due):  # rank 0's clock decides: a save's collectives need every rank
                return
        super().on_train_epoch_end(trainer, pl_module)
        self._saved_at = time.monotonic()

    @property
    @override
    def state_key(self) -> str:
        """``ModelCheckpoint``'s key, so that checkpoints written before this class existed resume alike."""
        return super().state_key.replace(type(self).__qualname__, ModelCheckpoint.__qualname__, 1)

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if self.monitor is None and state_dict.get("dirpath", self.dirpath) != self.dirpath:
            self.best_model_path = state_dict["best_model_path"]
        else:
            super().load_state_dict(state_dict)

    @override
    def _remove_checkpoint(self, trainer: pl.Trainer, filepath: str) -> None:
        if self.save_last:  # removed once last.ckpt links the new file (_save_last_checkpoint)
            self._superseded.append(filepath)
        else:
            super()._remove_checkpoint(trainer, filepath)

    @override
    def _save_last_checkpoint(self, trainer: pl.Trainer, monitor_candidates: dict[str, Any]) -> None:
        super()._save_last_checkpoint(trainer, monitor_candidates)
        superseded, self._superseded = self._superseded, []
        for filepath in superseded:
            super()._remove_checkpoint(trainer, filepath)

    @staticmethod
    @override
    def _link_checkpoint(trainer: pl.Trainer, filepath: str, linkpath: str) -> None:
        """Points ``linkpath`` to ``filepath`` in one rename: it is never missing or dangling."""
        if trainer.is_global_zero and os.path.abspath(filepath) != os.path.abspath(linkpath):
            folder = os.path.dirname(os.path.abspath(linkpath))
            temp = os.path.join(folder, f".{os.path.basename(linkpath)}.{os.getpid()}.tmp")
            with contextlib.suppress(FileNotFoundError):
                os.remove(temp)
            os.symlink(os.path.relpath(filepath, folder), temp)
            os.replace(temp, linkpath)
            sync_folder(folder)
        trainer.strategy.barrier()


def round_checkpoint(*, asynchronous: bool = False) -> RoundCheckpoint:
    """The latest round's checkpoint, written at the end of every round, or for an ``asynchronous``
    algorithm every :data:`ASYNC_EVERY_S` seconds of aggregations, with ``last.ckpt`` linked to it."""
    return RoundCheckpoint(every_s=ASYNC_EVERY_S if asynchronous else 0.0)


def run_directory(trainer: pl.Trainer) -> str | None:
    """This run's folder of the trainer's first logger, where ``ModelCheckpoint`` puts ``checkpoints/``:
    a CSV or TensorBoard logger's ``log_dir``, else ``<save_dir>/<name>/<version>`` (for W&B,
    ``<save_dir>/<project>/<run id>``); ``None`` without a logger.

    Unlike ``Trainer.log_dir`` (the shared ``save_dir`` of a W&B logger) it is one run's own, and it
    is read on this rank alone, without ``Trainer.log_dir``'s broadcast.
    """
    if not trainer.loggers:
        return None
    logger = trainer.loggers[0]
    if isinstance(logger, (CSVLogger, TensorBoardLogger)):
        return logger.log_dir
    version = logger.version if isinstance(logger.version, str) else f"version_{logger.version}"
    return os.path.join(logger.save_dir or trainer.default_root_dir, str(logger.name), version)


def find_last_checkpoint(trainer: pl.Trainer) -> str | None:
    """The checkpoint ``ckpt_path="last"`` resumes: the newest intact one
    (:func:`newest_intact_checkpoint`) in the first checkpoint folder that has one, of this
    trainer's checkpoint callbacks. A callback's fixed ``dirpath`` is its folder; without one, this
    run's own ``<run>/checkpoints`` comes first, then those of the experiment's other runs
    (``<save_dir>/<name>/*/checkpoints``, Lightning's layout), the most recently written first;
    without a logger, ``<default_root_dir>/checkpoints``. The fingerprint check then refuses a
    checkpoint of another configuration (:mod:`fl_lightning.checkpointing.fingerprint`)."""
    for folder in _checkpoint_folders(trainer):
        path = newest_intact_checkpoint(folder)
        if path is not None:
            return path
    return None


def sweep_temp_files(trainer: pl.Trainer) -> list[str]:
    """At fit start: removes the temporary files a killed save left (``.round_<r>.ckpt.<pid>.tmp`` of a
    dead ``pid``) in every checkpoint folder of this trainer (:func:`~fl_lightning.checkpointing.checkpoint_io.sweep_orphan_temp_files`)."""
    return [path for folder in dict.fromkeys(_checkpoint_folders(trainer)) for path in sweep_orphan_temp_files(folder)]


def _checkpoint_folders(trainer: pl.Trainer) -> list[str]:
    folders: list[str] = []
    for callback in trainer.checkpoint_callbacks:
        if callback.dirpath is not None:
            folders.append(str(callback.dirpath))
        elif trainer.loggers:
            logger = trainer.loggers[0]
            runs = glob.glob(os.path.join(logger.save_dir or trainer.default_root_dir, str(logger.name), "*", "checkpoints"))
            own = os.path.join(str(run_directory(trainer)), "checkpoints")
            folders += [own, *sorted((f for f in runs if f != own), key=os.path.getmtime, reverse=True)]
        else:
            folders.append(os.path.join(trainer.default_root_dir, "checkpoints"))
    return folders


_ROUND = re.compile(r"round_(\d+)\.ckpt")


def newest_intact_checkpoint(folder: str | os.PathLike[str]) -> str | None:
    """``last*.ckpt`` in ``folder`` (the newest, if there are several) when it is a whole file, else
    the ``round_<r>.ckpt`` of the highest round that is, with a warning naming both; ``None`` if none is.

    A kill between a round's write and the link swap, or a disk that filled up, can leave
    ``last.ckpt`` missing, dangling or truncated while the round's own file is intact.
    """
    lasts = sorted(
        (p for p in glob.glob(os.path.join(folder, "last*.ckpt")) if os.path.exists(p)), key=os.path.getmtime, reverse=True
    )
    rounds = {int(m.group(1)): os.path.join(folder, m.group(0)) for m in map(_ROUND.fullmatch, _names(folder)) if m}
    candidates = [*lasts, *(rounds[r] for r in sorted(rounds, reverse=True))]
    intact = next((path for path in candidates if is_intact(path)), None)
    if intact is not None and intact not in lasts:
        last = os.path.join(folder, "last.ckpt")
        state = "truncated" if os.path.exists(last) else "dangling" if os.path.islink(last) else "missing"
        rank_zero_warn(f"{last} is {state}: resuming from {intact}, the newest intact round checkpoint.")
    return intact


def _names(folder: str | os.PathLike[str]) -> list[str]:
    try:
        return os.listdir(folder)
    except (FileNotFoundError, NotADirectoryError):
        return []


def is_intact(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a whole ``torch.save`` file: a zip archive whose every member's CRC
    matches (a truncated file loses the archive's directory, written last)."""
    try:
        with zipfile.ZipFile(path) as archive:
            return archive.testzip() is None
    except (OSError, zipfile.BadZipFile):
        return False


class GlobalModelCheckpoint(Callback):
    """Puts the global model in every checkpoint's ``state_dict``, and a mid-round client's
    in-progress weights in the loop's state (``loops.fit_loop.federated.client_state``).

    Installed by :class:`~fl_lightning.FederatedTrainer`.
    """

    @override
    def on_save_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]) -> None:
        loop = trainer.fit_loop
        # Read by attribute, not ``isinstance``: the federated loop imports this package (no import cycle).
        if not getattr(loop, "in_round", False):
            return
        federated = checkpoint["loops"]["fit_loop"]["state_dict"]["federated"]
        federated["client_state"] = checkpoint["state_dict"]
        checkpoint["state_dict"] = loop.global_module_state()
