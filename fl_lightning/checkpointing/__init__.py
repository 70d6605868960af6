"""Checkpoints of a federated run: one per round, named by round, with the global model.

* :func:`round_checkpoint` is the ``ModelCheckpoint`` that :class:`~fl_lightning.FederatedTrainer`
  installs when checkpointing is on and none is given: after every round (for an asynchronous
  algorithm, whose aggregations are cheap, after the first aggregation that ends at least
  :data:`ASYNC_EVERY_S` after the previous save, and after the last), whatever
  ``check_val_every_n_epoch``, it writes ``round_<r>.ckpt``
  (``r`` the 0-based round, as in the logs' ``round`` column) atomically, links ``last.ckpt`` to
  it, and only then removes the file of the round before the previous one: a crash at any point leaves
  an intact one, and a corrupt newest file leaves the previous round to resume from.
* :func:`find_last_checkpoint` resolves ``ckpt_path="last"``: this run's own folder, else the
  experiment's newest run (each run of a logger gets a new version folder, where Lightning alone
  would look); in it ``last.ckpt``, or when that is missing, dangling, truncated or corrupt the newest
  intact checkpoint of any name (:func:`newest_intact_checkpoint`); a folder of corrupt files only is an error.
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
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from typing_extensions import override

from fl_lightning.checkpointing.checkpoint_io import CheckpointError, sweep_orphan_temp_files, sweep_unreferenced_shards, sync_folder
from fl_lightning.checkpointing.client_shards import shards_problem
from fl_lightning.checkpointing.integrity import integrity_problem

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
    and removes superseded files only once ``last.ckpt`` points to the new one. Without a monitor it keeps
    the ``keep`` newest round files, so that a resume from a corrupt newest one falls back to the round
    before (:func:`newest_intact_checkpoint`) instead of starting again; its state records them, so a run
    resumed into the same folder removes them in turn.

    Args:
        every_s: save at the end of a round only once this many seconds have passed since the
            previous save (and always after the first and the last round); ``0``: every round.
        keep: how many of the newest round files stay on disk (without a monitor and with ``save_top_k=1``,
            the default); at least 1.
        **kwargs: ``ModelCheckpoint``'s arguments; by default the file is ``round_<r>.ckpt``, saved
            at the end of the round (not at validation, which ``check_val_every_n_epoch`` may skip),
            with ``last.ckpt`` linked to it.
    """

    def __init__(self, *, every_s: float = 0.0, keep: int = 2, **kwargs: Any) -> None:
        if isinstance(every_s, bool) or not isinstance(every_s, (int, float)) or not 0 <= every_s < math.inf:
            raise ValueError(f"`every_s` must be a finite number of seconds >= 0, got {every_s!r}.")
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
            raise ValueError(f"`keep` must be a count of round files >= 1, got {keep!r}.")
        defaults = {
            "filename": ROUND_FILENAME,
            "auto_insert_metric_name": False,
            "save_last": "link",
            "every_n_epochs": 1,
            "save_on_train_epoch_end": True,
        }
        super().__init__(**{**defaults, **kwargs})
        self.every_s = float(every_s)
        self.keep = keep
        self._saved_at: float | None = None
        self._superseded: list[str] = []
        #: The round files on disk that this callback wrote and keeps by count, the newest last.
        self._kept: list[str] = []
        self._saving_last = False

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
    def state_dict(self) -> dict[str, Any]:
        """``ModelCheckpoint``'s state and the round files kept once the save under way is done."""
        return {**super().state_dict(), "kept": self._kept[-self.keep :]}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if self.monitor is None and state_dict.get("dirpath", self.dirpath) != self.dirpath:
            self.best_model_path = state_dict["best_model_path"]
        else:
            super().load_state_dict(state_dict)
            self._kept = list(state_dict.get("kept", []))

    @property
    def _keeps_by_count(self) -> bool:
        return self.monitor is None and self.save_top_k == 1

    @override
    def _save_checkpoint(self, trainer: pl.Trainer, filepath: str) -> None:
        if self._keeps_by_count and not self._saving_last:  # recorded first: the state saved in it lists it
            self._kept = [*(path for path in self._kept if path != filepath), filepath]
        super()._save_checkpoint(trainer, filepath)

    @override
    def _remove_checkpoint(self, trainer: pl.Trainer, filepath: str) -> None:
        if filepath in self._kept:  # removed by count (_save_last_checkpoint)
            return
        if self.save_last:  # removed once last.ckpt links the new file (_save_last_checkpoint)
            self._superseded.append(filepath)
        else:
            super()._remove_checkpoint(trainer, filepath)

    @override
    def _save_last_checkpoint(self, trainer: pl.Trainer, monitor_candidates: dict[str, Any]) -> None:
        self._saving_last = True
        try:
            super()._save_last_checkpoint(trainer, monitor_candidates)
        finally:
            self._saving_last = False
        superseded, self._superseded = self._superseded, []
        excess, self._kept = self._kept[: -self.keep], self._kept[-self.keep :]
        for filepath in [*superseded, *excess]:
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
    without a logger, ``<default_root_dir>/checkpoints``. A folder whose checkpoints are all corrupt ends the
    search with :class:`~fl_lightning.checkpointing.checkpoint_io.CheckpointError`, not an older run's or a
    fresh start. The fingerprint check then refuses a checkpoint of another configuration
    (:mod:`fl_lightning.checkpointing.fingerprint`)."""
    for folder in _checkpoint_folders(trainer):
        path = newest_intact_checkpoint(folder)
        if path is not None:
            return path
    return None


def sweep_temp_files(trainer: pl.Trainer) -> list[str]:
    """At fit start: removes, in every checkpoint folder of this trainer, the temporary files a killed save left
    (``.round_<r>.ckpt.<pid>.tmp`` of a dead ``pid``, :func:`~fl_lightning.checkpointing.checkpoint_io.sweep_orphan_temp_files`)
    and the client shards no checkpoint there references (a save killed before its round file's rename,
    :func:`~fl_lightning.checkpointing.checkpoint_io.sweep_unreferenced_shards`)."""
    folders = dict.fromkeys(_checkpoint_folders(trainer))
    return [path for folder in folders for sweep in (sweep_orphan_temp_files, sweep_unreferenced_shards) for path in sweep(folder)]


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
#: ``ModelCheckpoint``'s default file name, ``epoch=3-step=544.ckpt``.
_EPOCH, _STEP = re.compile(r"epoch=(\d+)"), re.compile(r"step=(\d+)")


def newest_intact_checkpoint(folder: str | os.PathLike[str]) -> str | None:
    """The checkpoint ``ckpt_path="last"`` resumes in ``folder``: ``last*.ckpt`` (the newest, if there are
    several) when it is whole (:func:`~fl_lightning.checkpointing.integrity.integrity_problem`, and the client shards
    it references, :func:`~fl_lightning.checkpointing.client_shards.shards_problem`), else the most
    advanced whole ``*.ckpt`` of any name (``round_<r>.ckpt``, a user ``ModelCheckpoint``'s
    ``epoch=3-step=544.ckpt``; by the round, epoch and step its name gives, then by when it was written), with a
    warning naming each one passed over; ``None`` when the folder holds no checkpoint.

    A kill between a round's write and the link swap, a disk that filled up or a flipped bit can leave
    ``last.ckpt`` missing, dangling, truncated or corrupt (or a shard it references) while an earlier checkpoint is whole.

    Raises:
        CheckpointError: when the folder holds checkpoints but none is whole, naming each and what is wrong:
            starting again from round 0 is a decision, not a fallback.
    """
    names = [n for n in _names(folder) if n.endswith(".ckpt") and not n.startswith(".")]
    paths = [os.path.join(folder, n) for n in names if os.path.isfile(os.path.join(folder, n))]
    lasts = sorted((p for p in paths if os.path.basename(p).startswith("last")), key=os.path.getmtime, reverse=True)
    others = sorted((p for p in paths if p not in lasts), key=_recency, reverse=True)
    last = os.path.join(folder, "last.ckpt")
    passed = [] if lasts or not others else [f"{last} is {'dangling' if os.path.islink(last) else 'missing'}"]
    for path in [*lasts, *others]:
        damage = _damage(path)
        if damage is None:
            if passed:
                rank_zero_warn(f"{'; '.join(passed)}: resuming from {path}, the newest intact checkpoint.")
            return path
        state, problem = damage
        passed.append(f"{path} is {state} ({problem})")
    if passed:
        raise CheckpointError(
            f"No intact checkpoint to resume from in {folder}: {'; '.join(passed)}. Resume from a copy of an intact "
            "checkpoint, or remove these files (or pass no ckpt_path) to start from round 0."
        )
    return None


def _recency(path: str) -> tuple[int, int, float]:
    """How far the run had come when it wrote ``path``, as its name says (``round_<r>``, ``epoch=<e>``, ``step=<s>``;
    ``-1`` where it does not), then when it was written: a copied or restored file's time says less than its name."""
    name = os.path.basename(path)
    epoch = _ROUND.fullmatch(name) or _EPOCH.search(name)
    step = _STEP.search(name)
    return int(epoch.group(1)) if epoch else -1, int(step.group(1)) if step else -1, os.path.getmtime(path)


def _damage(path: str) -> tuple[str, str] | None:
    """``(state, problem)`` of a checkpoint that is not whole: the file itself truncated or corrupt, or a client
    shard it references missing or corrupt (``incomplete``); ``None`` when it is whole."""
    problem = integrity_problem(path)
    if problem is not None:
        return ("truncated or corrupt" if "zip directory" in problem else "corrupt"), problem
    problem = shards_problem(path)
    return None if problem is None else ("incomplete", problem)


def _names(folder: str | os.PathLike[str]) -> list[str]:
    try:
        return os.listdir(folder)
    except (FileNotFoundError, NotADirectoryError):
        return []


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
