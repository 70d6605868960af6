"""The ``fl-lightning`` CLI end to end: fit, print_config round trips, every shipped config, errors, validate/test."""

from __future__ import annotations

import warnings

import csv
import shlex
from pathlib import Path

import pytest
import torch
import yaml

from fl_lightning.cli import FederatedCLI, main

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
QUICKSTART = str(CONFIGS / "quickstart.yaml")
#: Every shipped ``fl-lightning fit`` config; each arm of a study (``configs/studies``) is parsed as its runner layers
#: it by ``tests/study/test_shipped_studies.py``.
FIT_CONFIGS = sorted(p for p in CONFIGS.rglob("*.yaml") if p.parent != CONFIGS / "studies")


pytestmark = pytest.mark.usefixtures("cli_in_tmp_path")


def print_config(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main([*args, "--print_config"])
    assert exit_info.value.code in (0, None)
    return capsys.readouterr().out


def test_fit_quickstart_logs_and_prints_the_summary(tmp_path, capsys):
    main(["fit", "--config", QUICKSTART, "--trainer.max_epochs", "2", "--trainer.enable_progress_bar", "false"])

    out = capsys.readouterr().out
    assert "Federated fit summary" in out
    summary = {line.split("│")[1].strip(): line.split("│")[2].strip() for line in out.splitlines() if line.count("│") == 3}
    assert summary["rounds run"] == "2"
    assert 0.1 < float(summary["validation val_acc"]) <= 1.0 and float(summary["validation val_loss"]) > 0
    assert summary["test"] == "not run in fit: the command follows this table"  # validation is never labelled test
    run = "logs/quickstart/version_0"
    command = f"fl-lightning test --config {run}/config.yaml --ckpt_path {run}/checkpoints/round_1.ckpt"
    assert out.splitlines()[-1] == command  # below the table, on its own line
    # The config's CSVLogger has a relative save_dir: the run's logs land in the working directory.
    run_dir = tmp_path / "logs" / "quickstart" / "version_0"
    rows = list(csv.DictReader((run_dir / "metrics.csv").read_text().splitlines()))
    assert [int(float(r["round"])) for r in rows if r.get("round/clients")] == [0, 1]
    assert [int(float(r["round"])) for r in rows if r.get("val_acc")] == [0, 1]
    hparams = yaml.safe_load((run_dir / "hparams.yaml").read_text())
    assert hparams["fl/algorithm"] == "FedAvg" and hparams["fl/clients_per_round"] == 10
    # The resolved config is saved beside the logs and sent to the logger.
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["trainer"]["max_epochs"] == 2
    resolved = hparams["config"]  # the CLI logs its resolved config under `config`
    assert resolved["trainer"]["max_epochs"] == 2 and resolved["model"]["class_path"] == "fl_lightning.models.MLP"


def test_the_printed_test_command_runs_as_printed(capsys):
    """A new-user finding: the command named `<this config>`, so it could not be run as printed; it names the fit's
    resolved config.yaml now, overrides included."""
    main(["fit", "--config", QUICKSTART, "--trainer.max_epochs", "1", "--trainer.enable_progress_bar", "false"])
    command = shlex.split(capsys.readouterr().out.splitlines()[-1])
    assert command[:3] == ["fl-lightning", "test", "--config"]
    main(command[1:])
    assert "test_acc" in capsys.readouterr().out


def test_printed_config_round_trips_and_runs(tmp_path, capsys):
    printed = print_config(["fit", "--config", QUICKSTART, "--trainer.max_epochs", "1"], capsys)
    config = yaml.safe_load(printed)
    assert config["trainer"]["max_epochs"] == 1
    assert config["trainer"]["algorithm"]["class_path"] == "fl_lightning.FedAvg"
    assert config["model"]["init_args"]["hidden"] == [128]
    assert config["data"]["init_args"]["partitioner"] == {
        "class_path": "fl_lightning.data.Dirichlet",
        "init_args": {"alpha": 0.5, "min_samples": 1, "self_balancing": True},
    }
    path = tmp_path / "printed.yaml"
    path.write_text(printed)

    assert print_config(["fit", "--config", str(path)], capsys) == printed

    cli = FederatedCLI(args=["fit", "--config", str(path), "--trainer.logger", "false", "--trainer.enable_progress_bar", "false"])
    assert cli.trainer.current_epoch == 1
    assert "val_acc" in cli.trainer.callback_metrics


@pytest.mark.parametrize("path", FIT_CONFIGS, ids=[str(p.relative_to(CONFIGS)) for p in FIT_CONFIGS])
def test_every_shipped_config_parses(path, capsys):
    # Parsing only: it resolves every class_path and checks every argument's type, without
    # instantiating datasets that a paper config may need to download.
    config = yaml.safe_load(print_config(["fit", "--config", str(path)], capsys))
    assert {"trainer", "model", "data"} <= config.keys()
    assert config["trainer"]["algorithm"]["class_path"]


def test_unknown_class_path_fails_naming_it(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", QUICKSTART, "--trainer.algorithm.class_path", "fl_lightning.NoSuchAlgo"])
    assert exit_info.value.code not in (0, None)
    err = capsys.readouterr().err
    assert "fl_lightning.NoSuchAlgo" in err and "has no attribute 'NoSuchAlgo'" in err


def test_unknown_argument_fails(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", QUICKSTART, "--trainer.clients_per_rnd", "3"])
    assert exit_info.value.code not in (0, None)
    assert "clients_per_rnd" in capsys.readouterr().err


def test_validate_and_test_a_fitted_checkpoint(tmp_path):
    common = ["--config", QUICKSTART, "--trainer.logger", "false", "--trainer.enable_progress_bar", "false"]
    fitted = FederatedCLI(args=["fit", *common, "--trainer.max_epochs", "2"])
    fit_acc = float(fitted.trainer.callback_metrics["val_acc"])
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("*.ckpt")) == ["last.ckpt", "round_0.ckpt", "round_1.ckpt"]
    checkpoint = tmp_path / "checkpoints" / "last.ckpt"

    validated = FederatedCLI(args=["validate", *common, "--ckpt_path", str(checkpoint)])
    assert validated.trainer.state.fn == "validate"
    # The checkpoint holds the global model after round 2: validation reproduces fit's last numbers...
    assert float(validated.trainer.callback_metrics["val_acc"]) == pytest.approx(fit_acc)

    tested = FederatedCLI(args=["test", *common, "--ckpt_path", str(checkpoint)])
    assert tested.trainer.state.fn == "test"
    # ...and test evaluates the test split: plain accuracy of the checkpoint's model on it.
    model, data = tested.model, tested.datamodule
    x, y = data.test.tensors
    with torch.no_grad():
        expected = (model(x).argmax(-1) == y).float().mean().item()
    assert float(tested.trainer.callback_metrics["test_acc"]) == pytest.approx(expected)
    assert expected != pytest.approx(fit_acc)


def test_settings_a_class_change_drops_are_named_in_a_warning(capsys):
    # jsonargparse keeps the init args the new class takes and drops the rest, logging it at debug level only.
    config = str(CONFIGS / "papers" / "fedstaleweight_digits.yaml")
    switch = ["--trainer.algorithm", "fl_lightning.algorithms.FedBuff"]
    with pytest.warns(UserWarning, match=r"from 'fl_lightning\.algorithms\.FedStaleWeight' to 'fl_lightning\.algorithms\.FedBuff', discarding init_args: \{'variant': 'eq8', 'tracker'"):
        print_config(["fit", "--config", config, *switch], capsys)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the same config as written: nothing dropped, nothing said
        print_config(["fit", "--config", config], capsys)
