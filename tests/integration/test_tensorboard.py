"""TensorBoard works as the README says: the ``tensorboard`` extra, then a ``TensorBoardLogger`` on the
quickstart writes the rounds' metrics and the federated hyper-parameters to its event file."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from fl_lightning.cli import main

QUICKSTART = str(Path(__file__).resolve().parents[2] / "configs" / "quickstart.yaml")


def test_the_readme_tensorboard_command_logs_the_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("tensorboard", reason="the `tensorboard` extra (in `dev`) is not installed")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["fl-lightning"])
    # The README's command, 1 round.
    main(["fit", "--config", QUICKSTART, "--trainer.logger", "lightning.pytorch.loggers.TensorBoardLogger",
          "--trainer.logger.save_dir", "logs", "--trainer.logger.name", "quickstart", "--trainer.max_epochs", "1",
          "--trainer.enable_progress_bar", "false"])  # fmt: skip
    run = tmp_path / "logs" / "quickstart" / "version_0"
    events = b"".join(path.read_bytes() for path in run.glob("events.out.tfevents.*"))
    # TensorBoard's HPARAMS tab gets the federated configuration; the scalars get the rounds' metrics.
    assert b"fl/clients_per_round" in events and b"val_acc" in events
