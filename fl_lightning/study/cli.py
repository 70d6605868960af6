"""``fl-lightning-compare``: run a study of arms x seeds and compare them.

    fl-lightning-compare configs/studies/fedavg_vs_fedprox_digits.yaml
    fl-lightning-compare configs/studies/fedavg_vs_fedprox_digits.yaml --workers 3 --seeds '[0, 1]'
    fl-lightning-compare configs/studies/fedavg_vs_fedprox_digits.yaml --report_only true

A sibling of ``fl-lightning`` rather than one of its subcommands: LightningCLI's subcommands
are ``Trainer`` methods sharing one model/data/trainer parser, and a study is many fits,
each run by ``fl-lightning fit`` in its own process.
"""

from __future__ import annotations

import os
import signal
import sys
from dataclasses import replace
from typing import Literal

from jsonargparse import auto_cli

from fl_lightning.cli.errors import configuration_errors
from fl_lightning.study.compare import StudyResult, run_study
from fl_lightning.study.plots import require_matplotlib
from fl_lightning.study.spec import WandbSpec, load_study
from fl_lightning.utils.working_directory import import_from_working_directory


def compare(
    study: str,
    *,
    workers: int | None = None,
    seeds: list[int] | None = None,
    arms: list[str] | None = None,
    directory: str | None = None,
    wandb_project: str | None = None,
    wandb_mode: Literal["online", "offline", "disabled"] | None = None,
    plots: bool | None = None,
    report_only: bool = False,
) -> StudyResult:
    """Runs every (arm, seed) of a study that has not finished, then writes its summary table and plots.

    Args:
        study: the study file (see docs/comparing.md).
        workers: runs at once, each its own process (default: the study's ``workers``, else 1).
        seeds: run these seeds instead of the study's.
        arms: run only these arms.
        directory: the study directory (default: the study's, else studies/<name>).
        wandb_project: log to this W&B project (turns W&B on if the study file does not).
        wandb_mode: online, offline or disabled (default: WANDB_MODE, else the study's, else online).
        plots: draw the PNG plots (needs matplotlib, the `plots` extra).
        report_only: run nothing; rewrite the tables and plots from the runs so far.
    """
    with configuration_errors():  # a bad study file or option: one line, exit status 2
        spec = load_study(study)
        wandb = spec.wandb
        if wandb_project is not None:
            wandb = replace(wandb, project=wandb_project) if wandb is not None else WandbSpec(project=wandb_project)
        if wandb_mode is not None:
            if wandb is None:
                raise ValueError(
                    "`--wandb_mode` needs W&B on: add `wandb: {project: ...}` to the study or pass `--wandb_project`."
                )
            wandb = replace(wandb, mode=wandb_mode)
            os.environ["WANDB_MODE"] = wandb_mode  # over WANDB_MODE, for the runs and the summary run
        spec = spec.with_options(arms=arms, workers=workers, seeds=seeds, directory=directory, plots=plots)
        spec = replace(spec, wandb=wandb)
        if spec.plots:
            try:
                require_matplotlib()
            except ModuleNotFoundError as error:  # a missing extra is a setting to change, as a bad value is
                raise ValueError(str(error)) from error
    return run_study(spec, report_only=report_only)


def main(args: list[str] | None = None) -> None:
    """Console-script entry point: exit status 0 if no run failed or was refused, 1 if one did, 2 for a bad
    study file or option (one ``error:`` line), 130 if stopped.

    The study's class paths import from the working directory, as its runs' do (``python -m``).
    """
    import_from_working_directory()
    # Stopped by SIGTERM (a scheduler, `kill`), a study stops its runs too, as on Ctrl-C.
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        result = auto_cli(compare, args=args, as_positional=True)
    except KeyboardInterrupt:
        sys.exit(130)
    finally:
        signal.signal(signal.SIGTERM, previous)
    if not result.ok:
        sys.exit(1)  # the failed and refused runs and their errors are printed above


if __name__ == "__main__":
    main()
