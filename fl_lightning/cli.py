"""``fl-lightning``: the LightningCLI for federated experiments.

    fl-lightning fit --config configs/quickstart.yaml
    fl-lightning fit --config configs/quickstart.yaml --trainer.max_epochs 5 --print_config
"""

from __future__ import annotations

import time
from typing import Any

import yaml
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.cli import LightningCLI, SaveConfigCallback
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from rich.console import Console
from rich.table import Table

from fl_lightning.data.datamodule import FederatedDataModule
from fl_lightning.trainer import FederatedTrainer


class LoggerSaveConfigCallback(SaveConfigCallback):
    """Saves the resolved config in the log directory and sends it to every logger under
    ``config`` (e.g. the W&B run config), apart from the model's own hyper-parameters."""

    def save_config(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        config = yaml.safe_load(self.parser.dump(self.config, skip_none=False))
        for logger in trainer.loggers:
            logger.log_hyperparams({"config": config})


def fit_summary(trainer: Trainer, wall_time_s: float) -> Table:
    """Rounds run, final global-model metrics, bytes moved, wall time and log location."""
    metrics = trainer.callback_metrics
    loop = trainer.fit_loop
    table = Table(title="Federated fit summary", show_header=False)
    table.add_row("rounds run", str(trainer.current_epoch))
    for key, label in (("val_acc", "global test accuracy"), ("val_loss", "global test loss")):
        if key in metrics:
            table.add_row(label, f"{float(metrics[key]):.4f}")
    table.add_row("uploaded", _human_bytes(loop.total_upload_bytes))
    table.add_row("downloaded", _human_bytes(loop.total_download_bytes))
    table.add_row("wall time", f"{wall_time_s:.1f} s")
    table.add_row("logs", str(_log_dir(trainer)) if trainer.loggers else "(no logger)")
    return table


def _human_bytes(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.1f} {unit}" if unit != "B" else f"{n} B"
        value /= 1024
    raise AssertionError("unreachable")


def _log_dir(trainer: Trainer) -> str | None:
    """The first logger's directory, as ``Trainer.log_dir`` gives it, read on this rank only.

    ``Trainer.log_dir`` broadcasts from rank 0: called by rank 0 alone after ``fit`` (the summary),
    it fails or hangs because the other ranks have already moved on.
    """
    logger = trainer.loggers[0]
    return logger.log_dir if isinstance(logger, (TensorBoardLogger, CSVLogger)) else logger.save_dir


class FederatedCLI(LightningCLI):
    """LightningCLI with :class:`~fl_lightning.FederatedTrainer`, any LightningModule and any
    :class:`~fl_lightning.data.FederatedDataModule`, each selectable by ``class_path``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("trainer_class", FederatedTrainer)
        kwargs.setdefault("datamodule_class", FederatedDataModule)
        kwargs.setdefault("subclass_mode_model", True)
        kwargs.setdefault("subclass_mode_data", True)
        kwargs.setdefault("save_config_callback", LoggerSaveConfigCallback)
        kwargs.setdefault("save_config_kwargs", {"overwrite": True})
        self._fit_started = 0.0
        super().__init__(*args, **kwargs)

    def before_fit(self) -> None:
        self._fit_started = time.perf_counter()

    def after_fit(self) -> None:
        if self.trainer.is_global_zero:
            Console().print(fit_summary(self.trainer, time.perf_counter() - self._fit_started))


def main(args: list[str] | None = None) -> None:
    """Console-script entry point."""
    FederatedCLI(args=args)


if __name__ == "__main__":
    main()
