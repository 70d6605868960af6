"""Issue 25 item 4: ``fl-lightning --ckpt_path`` goes through the same checks as the Python API."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from fl_lightning.cli import main

from .corrupt import FLIPS

CONFIG = str(Path(__file__).resolve().parents[2] / "configs" / "quickstart.yaml")
FAST = [
    "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
    "--data.init_args.num_clients", "4", "--trainer.clients_per_round", "2",
]  # fmt: skip


pytestmark = pytest.mark.usefixtures("cli_in_tmp_path")


def fit(*args: str, rounds: int = 1) -> None:
    main(["fit", "--config", CONFIG, *FAST, "--trainer.max_epochs", str(rounds), *args])


def error_line(capsys: pytest.CaptureFixture[str], *args: str, rounds: int = 1) -> str:
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        fit(*args, rounds=rounds)
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert exit_info.value.code == 2 and len(errors) == 1 and "Traceback" not in err, err
    return errors[0]


def checkpoint(tmp_path: Path) -> Path:
    return tmp_path / "logs" / "quickstart" / "version_0" / "checkpoints" / "round_0.ckpt"


def test_a_truncated_checkpoint_is_one_error_line_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fit()
    cut = tmp_path / "cut.ckpt"
    cut.write_bytes(checkpoint(tmp_path).read_bytes()[:2000])
    assert error_line(capsys, "--ckpt_path", str(cut)).startswith(f"error: Cannot read checkpoint {cut}: the file is truncated")


@pytest.mark.parametrize("given", ["file", "last"])
def test_a_changed_lr_is_refused_not_replaced(tmp_path: Path, capsys: pytest.CaptureFixture[str], given: str) -> None:
    fit()
    path = str(checkpoint(tmp_path)) if given == "file" else "last"
    line = error_line(capsys, "--model.init_args.lr", "0.05", "--ckpt_path", path, rounds=2)
    assert "Cannot resume from" in line and "model.lr: 0.1 → 0.05" in line


def test_test_warns_naming_each_setting_the_checkpoint_restores(tmp_path: Path) -> None:
    fit()
    args = ["test", "--config", CONFIG, *FAST, "--model.init_args.lr", "0.05", "--ckpt_path", str(checkpoint(tmp_path))]
    expected = r"restores the model settings it was trained with over the configuration's: lr: 0\.05 → 0\.1\."
    with pytest.warns(UserWarning, match=expected):
        main(args)


def test_a_full_disk_is_one_error_line_naming_the_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(descriptor: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        fit()
    err = capsys.readouterr().err
    folder = tmp_path / "logs" / "quickstart" / "version_0" / "checkpoints"
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert exit_info.value.code == 1 and "Traceback" not in err, err
    assert len(errors) == 1 and errors[0].startswith(f"error: Cannot write checkpoint round_0.ckpt: no space left in {folder} (")
    assert errors[0].endswith(" bytes); the checkpoints written before are intact.")
    assert not list(folder.iterdir())


@pytest.mark.parametrize("given", ["file", "last"])
@pytest.mark.parametrize("flip", FLIPS.values(), ids=list(FLIPS))
def test_a_flipped_byte_is_one_error_line_naming_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str], flip, given: str) -> None:
    fit()  # one round: round_0.ckpt is the only checkpoint, so "last" has nothing to fall back to
    flip(checkpoint(tmp_path))
    line = error_line(capsys, "--ckpt_path", str(checkpoint(tmp_path)) if given == "file" else "last", rounds=2)
    assert str(checkpoint(tmp_path).relative_to(tmp_path)) in line, line  # the CLI's logs/ folder is relative
    expected = "error: Cannot read checkpoint" if given == "file" else "error: No intact checkpoint to resume from"
    assert line.startswith(expected), line
    assert not (tmp_path / "logs" / "quickstart" / "version_1" / "checkpoints").exists()  # no restart from round 0
