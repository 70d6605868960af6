"""TensorBoard works as the README says: the ``tensorboard`` extra, then a ``TensorBoardLogger`` on the
quickstart writes the rounds' metrics and the federated hyper-parameters to its event file, the user's and
the federated hyper-parameters as one HPARAMS session (TensorBoard shows a run's first session only)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import yaml
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

from fl_lightning.cli import main
from fl_lightning.models import MLP
from tests.loops.test_batched_clients import synthetic_data
from tests.quiet import quiet_trainer
from tests.recording_logger import RecordingLogger

QUICKSTART = str(Path(__file__).resolve().parents[2] / "configs" / "quickstart.yaml")

pytest.importorskip("tensorboard", reason="the `tensorboard` extra (in `dev`) is not installed")


def hparams_sessions(run: Path) -> list[set[str]]:
    """The hyper-parameter names of each session the HPARAMS plugin finds in ``run``'s event files, in order."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.plugins.hparams import metadata, plugin_data_pb2

    sessions = []
    for path in sorted(run.glob("events.out.tfevents.*")):
        for event in EventFileLoader(str(path)).Load():
            for value in event.summary.value:
                plugin = value.metadata.plugin_data
                if plugin.plugin_name == metadata.PLUGIN_NAME and value.tag == metadata.SESSION_START_INFO_TAG:
                    sessions.append(set(plugin_data_pb2.HParamsPluginData.FromString(plugin.content).session_start_info.hparams))
    return sessions


def test_the_readme_tensorboard_command_logs_the_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["fl-lightning"])
    # The README's command, 1 round.
    main(["fit", "--config", QUICKSTART, "--trainer.logger", "lightning.pytorch.loggers.TensorBoardLogger",
          "--trainer.logger.save_dir", "logs", "--trainer.logger.name", "quickstart", "--trainer.max_epochs", "1",
          "--trainer.enable_progress_bar", "false"])  # fmt: skip
    run = tmp_path / "logs" / "quickstart" / "version_0"
    events = b"".join(path.read_bytes() for path in run.glob("events.out.tfevents.*"))
    assert b"val_acc" in events  # the scalars get the rounds' metrics
    # Issue 37, item 6: the HPARAMS tab showed the CLI's config/* keys only, in the first of two sessions.
    (session,) = hparams_sessions(run)
    assert {"fl/clients_per_round", "fl/algorithm", "config/model/init_args/lr", "lr", "hidden"} <= session


def test_module_and_federated_hparams_are_one_tensorboard_session(tmp_path: Path) -> None:
    """From Python, the module's save_hyperparameters keys were the first session, the fl/* keys a second one
    TensorBoard does not show. Other loggers still get both calls."""
    tensorboard, csv, recording = TensorBoardLogger(tmp_path, name="tb"), CSVLogger(tmp_path, name="csv"), RecordingLogger()
    torch.manual_seed(0)
    trainer = quiet_trainer(max_epochs=1, clients_per_round=2, logger=[tensorboard, csv, recording])
    trainer.fit(MLP(in_features=12, hidden=(16,), num_classes=4, lr=0.1), datamodule=synthetic_data())
    (session,) = hparams_sessions(tmp_path / "tb" / "version_0")
    assert {"fl/algorithm", "fl/clients_per_round", "fl/client_executor", "lr", "in_features"} <= session
    csv_hparams = yaml.unsafe_load((tmp_path / "csv" / "version_0" / "hparams.yaml").read_text())  # holds a tuple
    for hparams in (csv_hparams, recording.hyperparameters):
        assert {"fl/algorithm", "fl/clients_per_round", "lr", "in_features"} <= set(hparams)
    assert "log_hyperparams" not in vars(tensorboard)  # the logger's own method is back after the fit
