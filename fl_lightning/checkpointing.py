"""Checkpoints of a federated run: one per round, named by round, with the global model.

* :func:`round_checkpoint` is the ``ModelCheckpoint`` that :class:`~fl_lightning.FederatedTrainer`
  installs when checkpointing is on and none is given: after every round it keeps
  ``round_<r>.ckpt`` (``r`` the 0-based round, as in the logs' ``round`` column) and links
  ``last.ckpt`` to it.
* :func:`find_last_checkpoint` resolves ``ckpt_path="last"`` across the earlier runs of the same
  experiment (each run of a logger gets a new version folder, where Lightning alone would look).
* :func:`run_directory` is the run's own folder of its first logger, which holds ``checkpoints/``.
* :class:`GlobalModelCheckpoint` makes every checkpoint's ``state_dict`` the global model, also
  when it is saved mid-round (the module then holds a client's weights, which go into the
  loop's state), so ``load_from_checkpoint`` returns the global model.
"""

from __future__ import annotations

import glob
import os
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from typing_extensions import override

#: The file name of each round's checkpoint (``round_3.ckpt``: the model after 0-based round 3).
ROUND_FILENAME = "round_{epoch}"


class RoundCheckpoint(ModelCheckpoint):
    """:func:`round_checkpoint`'s class. Resumed into a new version folder (each run of a logger
    gets one), it reloads ``best_model_path`` alone, as ``ModelCheckpoint`` does, but without its
    "dirpath has changed" warning: with no monitor there is no best-k bookkeeping to lose."""

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


def round_checkpoint() -> RoundCheckpoint:
    """The latest round's checkpoint, written every round, with ``last.ckpt`` linked to it."""
    return RoundCheckpoint(filename=ROUND_FILENAME, auto_insert_metric_name=False, save_last="link", every_n_epochs=1)


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
    """The newest ``last*.ckpt`` of this trainer's checkpoint callbacks, looking in every version
    folder of its first logger's experiment when a callback has no fixed ``dirpath``
    (``<save_dir>/<name>/*/checkpoints``, Lightning's layout), else in ``<default_root_dir>/checkpoints``."""
    patterns = []
    for callback in trainer.checkpoint_callbacks:
        if callback.dirpath is not None:
            patterns.append(os.path.join(callback.dirpath, "last*.ckpt"))
        elif trainer.loggers:
            logger = trainer.loggers[0]
            save_dir = logger.save_dir or trainer.default_root_dir
            patterns.append(os.path.join(save_dir, str(logger.name), "*", "checkpoints", "last*.ckpt"))
        else:
            patterns.append(os.path.join(trainer.default_root_dir, "checkpoints", "last*.ckpt"))
    candidates = [path for pattern in patterns for path in glob.glob(pattern) if os.path.exists(path)]
    return max(candidates, key=os.path.getmtime) if candidates else None


class GlobalModelCheckpoint(Callback):
    """Puts the global model in every checkpoint's ``state_dict``, and a mid-round client's
    in-progress weights in the loop's state (``loops.fit_loop.federated.client_state``).

    Installed by :class:`~fl_lightning.FederatedTrainer`.
    """

    @override
    def on_save_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]) -> None:
        from fl_lightning.loops.federated_fit_loop import FederatedFitLoop

        loop = trainer.fit_loop
        if not isinstance(loop, FederatedFitLoop) or not loop.in_round:
            return
        federated = checkpoint["loops"]["fit_loop"]["state_dict"]["federated"]
        federated["client_state"] = checkpoint["state_dict"]
        checkpoint["state_dict"] = loop.global_module_state()
