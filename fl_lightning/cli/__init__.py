"""``fl-lightning``: the LightningCLI for federated experiments.

    fl-lightning fit --config configs/quickstart.yaml
    fl-lightning fit --config configs/quickstart.yaml --trainer.max_epochs 5 --print_config

A bad value in the configuration ends the command with one ``error: ...`` line and exit status 2
(:mod:`fl_lightning.cli.errors`; ``FL_LIGHTNING_DEBUG=1`` shows the traceback).
"""

from __future__ import annotations

import os
import shlex
import sys
import time
import warnings
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml
from lightning.pytorch import LightningDataModule, LightningModule, Trainer
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI, SaveConfigCallback
from rich.console import Console
from rich.table import Table
from typing_extensions import override

from fl_lightning._lazy import import_every_export
from fl_lightning.checkpointing.checkpoint_io import CheckpointWriteError, model_settings_replaced, read_checkpoint
from fl_lightning.checkpointing import run_directory
from fl_lightning.cli.errors import DEBUG_ENV, ConsoleParser, RunStarted, configuration_errors, file_system_errors
from fl_lightning.cli import strict_yaml
from fl_lightning.cli.discarded_init_args import discarded_init_args_logger
from fl_lightning.cli.help import PlainHelpParser
from fl_lightning.loops.async_fit_loop import AsyncFitLoop
from fl_lightning.trainer import FederatedTrainer
from fl_lightning.utils.metric_names import logged_test_metrics, logged_validation_metrics, monitored_metrics, require_logged
from fl_lightning.utils.run_names import stamp_wandb_names
from fl_lightning.utils.working_directory import import_from_working_directory


class LoggerSaveConfigCallback(SaveConfigCallback):
    """Saves the resolved config as ``config.yaml`` in the run's own log directory and sends it to every
    logger under ``config`` (e.g. the W&B run config), apart from the model's own hyper-parameters.

    The run's own directory is :func:`~fl_lightning.checkpointing.run_directory` (beside
    ``checkpoints/``; for W&B not the ``save_dir`` that all runs share, where each run's config would
    overwrite the previous one). Without a logger nothing is saved: no file lands in the current directory.
    """

    @override
    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if self.already_saved:
            return
        if trainer.is_global_zero:
            directory = run_directory(trainer)
            if directory is not None:
                os.makedirs(directory, exist_ok=True)
                path = os.path.join(directory, self.config_filename)
                self.parser.save(self.config, path, skip_unset=False, overwrite=self.overwrite, multifile=self.multifile)
            self.save_config(trainer, pl_module, stage)
            self.already_saved = True
        # Every rank agrees, as Lightning's own setup does, so later setups skip on all of them.
        self.already_saved = trainer.strategy.broadcast(self.already_saved)

    @override
    def save_config(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        config = yaml.safe_load(self.parser.dump(self.config, skip_unset=False))
        for logger in trainer.loggers:
            logger.log_hyperparams({"config": config})


def fit_summary(trainer: Trainer, wall_time_s: float) -> Table:
    """Rounds run and how the fit ended, the privacy spent (a DP run: ε at δ, the accountant and the neighbouring
    relation), the global model's final validation (and, if run, test) metrics under the module's own names,
    bytes moved, wall time and log location."""
    loop = trainer.fit_loop
    table = Table(title="Federated fit summary", show_header=False)
    table.add_column()
    table.add_column(overflow="fold")  # a long checkpoint path wraps whole, so it can be copied; never "…"
    # An asynchronous algorithm's "round" is one aggregation of its buffer, as its progress bar says.
    table.add_row("aggregations run" if isinstance(loop, AsyncFitLoop) else "rounds run", str(trainer.current_epoch))
    table.add_row("ended", getattr(loop, "stop_reason", None) or "unknown")
    algorithm = getattr(trainer, "algorithm", None)
    statement = algorithm.privacy_statement() if algorithm is not None else None
    if statement:
        table.add_row("privacy", statement)
    for label, value in evaluation_rows(trainer):
        table.add_row(label, value)
    kinds = getattr(loop, "kinds", None)
    if kinds is not None:
        table.add_row("federated values", kinds.summary_line(trainer.lightning_module.state_dict()))
    table.add_row("uploaded", _human_bytes(loop.total_upload_bytes))
    table.add_row("downloaded", _human_bytes(loop.total_download_bytes))
    table.add_row("wall time", f"{wall_time_s:.1f} s")
    # run_directory, not Trainer.log_dir: that broadcasts, and only rank 0 prints the summary.
    table.add_row("logs", run_directory(trainer) or "(no logger)")
    return table


def print_fit_report(trainer: Trainer, wall_time_s: float) -> None:
    """Prints :func:`fit_summary` to stdout, then :func:`checkpoint_test_command` on a line of its own, unwrapped."""
    console = Console()
    console.print(fit_summary(trainer, wall_time_s))
    command = checkpoint_test_command(trainer)
    if command is not None:
        source = "this fit's resolved config, saved with its logs" if saved_config(trainer) else "<this config>: this fit's --config files and overrides"
        console.print(f"Test the global model ({source}):", markup=False, highlight=False)
        console.print(command, soft_wrap=True, markup=False, highlight=False)  # one line, whatever the width


def evaluation_rows(trainer: Trainer) -> list[tuple[str, str]]:
    """``(label, value)`` rows of the final validation and test metrics, never one labelled as the other.

    Validation: the ``ModelCheckpoint``/``EarlyStopping`` monitors first, then every other
    metric the module logged in validation. Test: what :class:`~fl_lightning.callbacks.TestCurve`
    logged, else a pointer to :func:`checkpoint_test_command`, printed below the table.

    Raises:
        ValueError: A monitored metric was never logged (names it and lists those that were).
    """
    metrics = trainer.callback_metrics
    monitors = monitored_metrics(trainer)
    for name in monitors:
        require_logged(name, metrics, role="The monitored metric")
    validation = [*monitors, *(m for m in logged_validation_metrics(trainer) if m not in monitors and m in metrics)]
    rows = [
        (f"validation {name}" + (f" (monitored, {monitors[name]})" if name in monitors else ""), f"{float(metrics[name]):.4f}")
        for name in validation
    ]
    if not rows:
        rows.append(("validation", "none (no validation set, or validation never due)"))
    tested = [m for m in logged_test_metrics(trainer) if m in metrics]
    rows += [(f"test {name} (TestCurve, not for selection)", f"{float(metrics[name]):.4f}") for name in tested]
    if not tested:
        rows.append(("test", "not run in fit: the command follows this table"))
    return rows


def checkpoint_test_command(trainer: Trainer) -> str | None:
    """The ``fl-lightning test`` command for the fit's checkpoint, or ``None`` when ``TestCurve`` logged test metrics.

    It names the fit's resolved ``config.yaml`` (:func:`saved_config`), so it runs as printed; ``<this config>``
    only where no config was saved (a fit without a logger, or from Python). The CLI prints it below the summary
    table, never inside it: a table cell wraps a long path over several lines whenever stdout is not a terminal
    (a log file, CI), and a wrapped command cannot be copied.
    """
    if any(m in trainer.callback_metrics for m in logged_test_metrics(trainer)):
        return None
    checkpoint = getattr(trainer.checkpoint_callback, "best_model_path", "")
    config = saved_config(trainer)
    return (
        f"fl-lightning test --config {shlex.quote(config) if config else '<this config>'} "
        f"--ckpt_path {shlex.quote(checkpoint) if checkpoint else '<checkpoint>'}"
    )


def saved_config(trainer: Trainer) -> str | None:
    """The config file that :class:`LoggerSaveConfigCallback` wrote for this run, or ``None`` if it wrote none."""
    directory = run_directory(trainer)
    for callback in trainer.callbacks:
        if isinstance(callback, LoggerSaveConfigCallback) and directory is not None:
            path = os.path.join(directory, callback.config_filename)
            return path if os.path.isfile(path) else None
    return None


def _human_bytes(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.1f} {unit}" if unit != "B" else f"{n} B"
        value /= 1024
    raise AssertionError("unreachable")


class FederatedCLI(LightningCLI):
    """LightningCLI with :class:`~fl_lightning.FederatedTrainer`, any LightningModule and any
    LightningDataModule, each selectable by ``class_path``: a :class:`~fl_lightning.data.FederatedDataModule`
    (:class:`~fl_lightning.data.Federated` wraps a user's datamodule), or a plain datamodule that the
    trainer federates with ``trainer.num_clients`` and ``trainer.partitioner`` (``docs/lightning_integration.md``).

    Its help is plain text (:class:`~fl_lightning.cli.help.PlainHelpParser`); a W&B logger's fixed
    ``name`` gets the run's start time appended (:mod:`fl_lightning.utils.run_names`).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("trainer_class", FederatedTrainer)
        kwargs.setdefault("datamodule_class", LightningDataModule)
        kwargs.setdefault("subclass_mode_model", True)
        kwargs.setdefault("subclass_mode_data", True)
        kwargs.setdefault("save_config_callback", LoggerSaveConfigCallback)
        kwargs.setdefault("save_config_kwargs", {"overwrite": True})
        kwargs.setdefault("parser_class", PlainHelpParser)
        kwargs.setdefault("parser_kwargs", {}).setdefault("description", _DESCRIPTION)
        kwargs["parser_kwargs"].setdefault("parser_mode", strict_yaml.MODE)  # duplicate keys, alias bombs refused
        self._fit_started = 0.0
        # A config may name a class by its short name (`class_path: QFedAvg`), which jsonargparse finds among the
        # subclasses already imported: the CLI imports every public class, not on first use as `import fl_lightning`.
        import_every_export()
        super().__init__(*args, **kwargs)

    @override
    def init_parser(self, **kwargs: Any) -> LightningArgumentParser:
        """Lightning's parser, logging to :func:`~fl_lightning.cli.discarded_init_args.discarded_init_args_logger`
        (set before its arguments are added, which take their parser's logger)."""
        parser = super().init_parser(**kwargs)
        parser.logger = discarded_init_args_logger()
        return parser

    @override
    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand] if self.subcommand is not None else self.config  # run=False: no subcommand
        stamp_wandb_names(config.get("trainer.logger"), datetime.now())

    @override
    def _parse_ckpt_path(self) -> None:
        """``--ckpt_path FILE`` is read through the checks a resume makes (one error naming a truncated
        or foreign file). ``fit`` keeps the configuration's model settings, which the resume's
        fingerprint compares with the checkpoint's (:mod:`fl_lightning.checkpointing.fingerprint`); ``validate``,
        ``test`` and ``predict`` build the model with the checkpoint's, as LightningCLI does, and warn
        naming each setting that replaces a configured one."""
        subcommand = self.config.get("subcommand")
        path = self.config[subcommand].get("ckpt_path") if subcommand else None
        if not path or not Path(path).is_file():  # "last", or a missing file that fit reports
            return
        saved = read_checkpoint(path).get("hyper_parameters") or {}
        if subcommand == "fit" or not saved:
            return
        given = self.config[subcommand].get("model", {}).get("init_args") or {}
        replaced = model_settings_replaced(saved, dict(given))
        if replaced:
            listing = "; ".join(replaced)
            warnings.warn(f"{path} restores the model settings it was trained with over the configuration's: {listing}.")
        super()._parse_ckpt_path()

    def before_fit(self) -> None:
        self._fit_started = time.perf_counter()

    def after_fit(self) -> None:
        if self.trainer.is_global_zero:
            print_fit_report(self.trainer, time.perf_counter() - self._fit_started)


_DESCRIPTION = (
    "Federated learning with PyTorch Lightning: one Trainer, one fit. A bad configuration value ends "
    f"with one 'error:' line (exit status 2); set {DEBUG_ENV}=1 for the full traceback."
)


def main(args: list[str] | None = None) -> None:
    """Console-script entry point: configuration errors as one line (:mod:`fl_lightning.cli.errors`);
    the config's class paths import from the working directory, as under ``python -m``."""
    import_from_working_directory()
    started = RunStarted()
    with file_system_errors(), configuration_errors(started):
        try:
            FederatedCLI(args=args, trainer_defaults={"callbacks": [started]}, parser_class=ConsoleParser)
        except CheckpointWriteError as error:  # a full disk mid-run: the message says all
            print(f"error: {error}", file=sys.stderr)
            raise SystemExit(1) from None
