"""A new user's sequence model, federated: ``examples/char_gru.py`` (Embedding + GRU, dict batches from a
padding ``collate_fn``, ``val/char_acc`` and ``val/ppl``, a datamodule reading ``self.hparams`` everywhere)
through the Python API, ``fl-lightning fit`` run from the project's folder, and the user's own LightningCLI.
Walkthrough: ``docs/walkthrough_sequence_model.md``."""

from __future__ import annotations

import logging
import math
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import yaml
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.core.saving import load_hparams_from_yaml

from fl_lightning import FederatedTrainer
from tests.integration.test_examples import EXAMPLES, load_example
from tests.quiet import QUIET
from tests.recording_logger import RecordingLogger

#: The datamodule's own arguments, as its ``save_hyperparameters()`` records them.
DATA_HPARAMS = {"modules": ("argparse", "json", "csv", "unittest", "logging"), "seq_len": 64, "batch_size": 16, "val_every": 10}


@pytest.fixture(scope="module")
def char_gru() -> ModuleType:
    return load_example("char_gru")


@pytest.fixture
def lightning_info() -> Iterator[list[str]]:
    """What Lightning's ``rank_zero_info`` lets through (its "💡 Tip" lines included, unless filtered)."""
    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())  # type: ignore[method-assign]
    logger = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    logger.addHandler(handler)
    yield records
    logger.removeHandler(handler)


def test_two_rounds_through_the_python_api_learn_and_log_every_hyperparameter(
    char_gru: ModuleType, lightning_info: list[str]
) -> None:
    logger = RecordingLogger()
    metrics = char_gru.main(rounds=2, **{**QUIET, "logger": logger})
    assert lightning_info and not [line for line in lightning_info if "💡" in line]
    assert set(metrics) == {"val/char_acc", "val/ppl"}
    assert 1 < metrics["val/ppl"] < char_gru.VOCAB  # better than a uniform guess over the characters
    logged = logger.hyperparameters
    assert {key: logged[key] for key in DATA_HPARAMS} == DATA_HPARAMS  # the inner datamodule's, as plain Lightning logs
    assert logged["hidden"] == 64 and logged["fl/data.num_clients"] == 8 and logged["fl/data.datamodule"] == "DocstringLines"


def test_fl_lightning_fit_imports_the_project_from_its_folder(tmp_path: Path) -> None:
    # The real console script, in the project's folder, no PYTHONPATH: it imports char_gru as `python -m` would.
    for name in ("char_gru.py", "char_gru.yaml"):
        shutil.copy(EXAMPLES / name, tmp_path / name)
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"} | {"COLUMNS": "100"}
    script = Path(sys.executable).parent / "fl-lightning"
    result = subprocess.run(
        [str(script), "fit", "--config", "char_gru.yaml", "--trainer.max_epochs", "2", "--trainer.enable_progress_bar", "false"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "validation val/ppl" in output and "💡" not in output
    logged = load_hparams_from_yaml(str(tmp_path / "logs" / "char_gru" / "version_0" / "hparams.yaml"))
    own = ("seq_len", "batch_size", "val_every")  # `modules`, a tuple, is written as a YAML python/tuple
    assert {key: logged[key] for key in own} == {key: DATA_HPARAMS[key] for key in own}
    assert logged["fl/data.num_clients"] == 8


def test_a_users_own_lightning_cli_hands_the_datamodule_its_own_hparams(
    char_gru: ModuleType, lightning_info: list[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)  # LightningCLI saves config.yaml in the working directory
    datamodule = {"class_path": "example_char_gru.DocstringLines", "init_args": {"seq_len": 32}}
    data = {"class_path": "fl_lightning.data.Federated", "init_args": {"datamodule": datamodule, "num_clients": 4}}
    monkeypatch.setitem(sys.modules, "example_char_gru", char_gru)  # importable by class_path, as the user's module is
    monkeypatch.setattr(sys, "argv", ["main.py"])  # pytest's own arguments are not the CLI's
    cli = LightningCLI(
        char_gru.CharGRU,
        trainer_class=FederatedTrainer,
        subclass_mode_data=True,
        args=["fit", "--seed_everything", "0", "--trainer.max_epochs", "1", "--trainer.clients_per_round", "2",
              "--data", yaml.safe_dump(data), *[f"--trainer.{key}={value}" for key, value in QUIET.items()]],
    )  # fmt: skip
    inner = cli.datamodule.datamodule
    assert dict(inner.hparams) == {**DATA_HPARAMS, "seq_len": 32}  # its own, not Federated's
    assert dict(cli.datamodule.hparams) == dict(inner.hparams)
    assert math.isfinite(cli.trainer.callback_metrics["val/ppl"])
    assert lightning_info and not [line for line in lightning_info if "💡" in line]
