"""A callback that crashes a run once (importable by the study's ``fl-lightning fit`` processes)."""

from __future__ import annotations

from pathlib import Path

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback


class CrashOnce(Callback):
    """Raises at the start of round ``at_round`` of the run with trainer seed ``seed``, the first time only.

    ``marker`` records that it crashed, so the next attempt of the run goes through.
    """

    def __init__(self, marker: str, seed: int, at_round: int = 1) -> None:
        self.marker, self.seed, self.at_round = Path(marker), seed, at_round

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.fit_loop.seed == self.seed and trainer.current_epoch == self.at_round and not self.marker.exists():
            self.marker.touch()
            raise RuntimeError(f"simulated crash in round {self.at_round}")
