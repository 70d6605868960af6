"""The table of Trainer arguments under federation (``docs/lightning_integration.md``) through ``fl-lightning``:
a refused or out-of-range value is one ``error:`` line with exit status 2; a per-round argument does what the
table says, and the fit summary says how the fit ended."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fl_lightning.cli import FederatedCLI, main
from fl_lightning.server.model_state import live_tensors

from .test_cli_errors import FAST, QUICKSTART, one_line_error

CLIENTS_PER_ROUND = 10  # configs/quickstart.yaml
QUIET = [*FAST, "--trainer.logger", "false", "--trainer.enable_checkpointing", "false"]


pytestmark = pytest.mark.usefixtures("cli_in_tmp_path")


PREFIX = "error: FederatedTrainer: "
REFUSED = [
    (["--trainer.max_epochs", "-5"], "`max_epochs` (rounds) must be an integer >= 0 or -1 (no limit), got -5."),
    (["--trainer.devices", "0"], "`devices` must be 'auto', a positive number of devices, -1 (all of them)"),
    (
        ["--trainer.check_val_every_n_epoch", "0"],
        "`check_val_every_n_epoch` (rounds between two validations) must be an integer >= 1, got 0.",
    ),
    (["--trainer.val_check_interval", "0.5"], "`val_check_interval=0.5` would validate inside a round"),
    (["--trainer.limit_train_batches", "0"], "`limit_train_batches=0` trains no client"),
    (["--trainer.reload_dataloaders_every_n_epochs", "1"], "`reload_dataloaders_every_n_epochs=1` cannot be honoured"),
    (["--trainer.sync_batchnorm", "true"], "`sync_batchnorm=True` would synchronise BatchNorm statistics"),
    (["--trainer.barebones", "true"], "`barebones=True` disables the logging and callbacks"),
    (["--trainer.limit_val_batches", "-1"], "You have passed invalid value -1 for limit_val_batches"),
]


@pytest.mark.parametrize(("override", "expected"), REFUSED, ids=[o[0].removeprefix("--trainer.") for o, _ in REFUSED])
def test_a_refused_trainer_argument_is_one_error_line(
    override: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    line = one_line_error(["fit", "--config", QUICKSTART, *QUIET, *override], capsys)
    assert line.startswith(PREFIX + expected), line


@pytest.mark.skipif(torch.cuda.is_available() or torch.backends.mps.is_available(), reason="needs a machine without a GPU")
def test_an_accelerator_this_machine_lacks_is_one_error_line(capsys: pytest.CaptureFixture[str]) -> None:
    line = one_line_error(["fit", "--config", QUICKSTART, *QUIET, "--trainer.accelerator", "gpu"], capsys)
    assert line == PREFIX + "`accelerator='gpu'` is not available on this machine: use one of ['auto', 'cpu']."


def _fit(*override: str) -> FederatedCLI:
    return FederatedCLI(args=["fit", "--config", QUICKSTART, *QUIET, *override])


@pytest.mark.parametrize(
    ("override", "batches_per_client"),
    [(["--trainer.overfit_batches", "1"], 1), (["--trainer.limit_train_batches", "2"], 2)],
    ids=["overfit_batches", "limit_train_batches"],
)
def test_batch_limits_reach_every_client(override: list[str], batches_per_client: int) -> None:
    cli = _fit(*override)
    assert cli.trainer.global_step == CLIENTS_PER_ROUND * batches_per_client


def test_max_steps_stops_at_the_end_of_the_round_with_the_global_model(capsys: pytest.CaptureFixture[str]) -> None:
    cli = _fit("--trainer.max_steps", "3", "--trainer.max_epochs", "3")
    loop = cli.trainer.fit_loop
    assert cli.trainer.current_epoch == 1 and cli.trainer.global_step > 3  # round 0 in full
    assert not loop.in_round and all(torch.equal(t, loop.global_state[k]) for k, t in live_tensors(cli.model).items())
    assert "ended" in capsys.readouterr().out and loop.stop_reason.startswith("max_steps=3 reached in round 0")


def test_fast_dev_run_through_the_cli_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    main(["fit", "--config", QUICKSTART, *FAST, "--trainer.fast_dev_run", "true"])  # with the config's CSV logger
    out = capsys.readouterr().out
    assert "fast_dev_run: one round" in out  # the summary's "ended" row
    assert list(tmp_path.iterdir()) == []


def test_max_time_stops_at_the_end_of_a_round() -> None:
    cli = _fit("--trainer.max_time", '{"microseconds": 1}', "--trainer.max_epochs", "3")
    assert cli.trainer.current_epoch == 1
    assert cli.trainer.fit_loop.stop_reason == "time limit (max_time or a Timer) reached in round 0; stopped at its end"


def test_check_val_every_n_epoch_counts_rounds() -> None:
    skipped = _fit("--trainer.check_val_every_n_epoch", "2")  # FAST: 1 round, so no validation is due
    validated = _fit("--trainer.check_val_every_n_epoch", "1")
    assert "val_acc" not in skipped.trainer.callback_metrics and "val_acc" in validated.trainer.callback_metrics


HONOURED = [
    ("gradient_clip_val", "0.5", 0.5),
    ("accumulate_grad_batches", "2", 2),
    ("limit_val_batches", "1", 1),
    ("num_sanity_val_steps", "1", 1),
    ("log_every_n_steps", "1", 1),
    ("min_epochs", "1", 1),
    ("min_steps", "1", 1),
    ("precision", "64-true", "64-true"),
]


@pytest.mark.parametrize(("name", "value", "parsed"), HONOURED, ids=[name for name, _, _ in HONOURED])
def test_an_honoured_trainer_argument_reaches_the_trainer_and_the_round_completes(name: str, value: str, parsed: object) -> None:
    cli = _fit(f"--trainer.{name}", value)
    assert getattr(cli.trainer, name) == parsed
    assert cli.trainer.current_epoch == 1 and cli.trainer.fit_loop.stop_reason == "all max_epochs=1 rounds done"
