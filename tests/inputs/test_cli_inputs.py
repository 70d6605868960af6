"""Bad inputs through ``fl-lightning``: numbers, duplicate YAML keys, alias bombs and unwritable files each end
with one ``error:`` line (no traceback) naming what is wrong."""

from __future__ import annotations

import errno
import re
from pathlib import Path

import pytest

from fl_lightning.cli import main
from fl_lightning.cli.errors import file_system_errors
from fl_lightning.cli.strict_yaml import MAX_EXPANDED_NODES

from ..integration.test_cli_errors import FAST, QUICKSTART, one_line_error

pytestmark = pytest.mark.usefixtures("cli_in_tmp_path")

NUMBERS = [
    (["--trainer.accumulate_grad_batches", "-2"], r"`accumulate_grad_batches` .* must be an integer >= 1, got -2\.$"),
    (["--trainer.accumulate_grad_batches", "0"], r"`accumulate_grad_batches` .* must be an integer >= 1, got 0\.$"),
    (["--trainer.gradient_clip_val", "-1"], r"`gradient_clip_val` must be a finite number >= 0, got -1"),
    (["--trainer.max_time", '{"hours": -1}'], r"`max_time` must be a positive duration: .*got \{'hours': -1\}\.$"),
    (["--trainer.min_epochs", "5", "--trainer.max_epochs", "2"], r"`min_epochs=5` must not exceed `max_epochs=2`\.$"),
    (["--trainer.log_every_n_steps", "0"], r"`log_every_n_steps` .* must be an integer >= 1, got 0\.$"),
    (["--model.init_args.lr", ".nan"], r"^error: MLP: `lr` must be a finite number > 0, got nan\.$"),
    (["--model.init_args.lr", ".inf"], r"^error: MLP: `lr` must be a finite number > 0, got inf\.$"),
    (["--trainer.algorithm", "fl_lightning.FedProx", "--trainer.algorithm.init_args.mu", ".nan"], r"^error: FedProx: `mu` must be a finite number >= 0, got nan\.$"),
    (["--trainer.algorithm", "fl_lightning.FedProx", "--trainer.algorithm.init_args.mu", ".inf"], r"`mu` must be a finite number >= 0, got inf\.$"),
    (
        ["--trainer.algorithm", "fl_lightning.FedAvg", "--trainer.algorithm.init_args.server_optimizer", "fl_lightning.ServerAdam",
         "--trainer.algorithm.init_args.server_optimizer.init_args.lr", ".nan"],
        r"`lr` must be a finite number > 0, got nan\.$",
    ),
    (["--data.init_args.partitioner.init_args.alpha", ".inf"], r"^error: Dirichlet: `alpha` must be a finite number > 0, got inf\.$"),
    (["--data.init_args.val_fraction", ".nan"], r"val_fraction must be a float in \(0, 1\) \(exclusive\), got nan\.$"),
    (["--trainer.clients_per_round", ".nan"], r"`clients_per_round` must be a positive count or a fraction in \(0, 1\], got nan\.$"),
]


@pytest.mark.parametrize(("override", "pattern"), NUMBERS, ids=[" ".join(o[-2:]) for o, _ in NUMBERS])
def test_a_bad_number_on_the_command_line_is_one_error_line(override: list[str], pattern: str, capsys: pytest.CaptureFixture[str]) -> None:
    line = one_line_error(["fit", "--config", QUICKSTART, *FAST, "--trainer.logger", "false", *override], capsys)
    assert re.search(pattern, line), line


def _config(tmp_path: Path, text: str) -> str:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    return str(path)


def test_a_duplicate_yaml_key_is_one_error_line_naming_it_and_both_lines(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = _config(tmp_path, "trainer:\n  max_epochs: 1\nseed_everything: 0\ntrainer:\n  max_epochs: 2\n")
    line = one_line_error(["fit", "--config", QUICKSTART, "--config", config], capsys)
    assert "duplicate key 'trainer' at line 4 (first at line 1)" in line, line


def test_a_duplicate_nested_key_is_refused_too(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = _config(tmp_path, "trainer:\n  max_epochs: 1\n  seed: 0\n  max_epochs: 3\n")
    line = one_line_error(["fit", "--config", QUICKSTART, "--config", config], capsys)
    assert "duplicate key 'max_epochs' at line 4 (first at line 2)" in line, line


def test_an_alias_bomb_is_refused_before_it_expands(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    levels = ['a0: &a0 ["x","x","x","x","x","x","x","x","x"]']
    levels += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 10)]
    config = _config(tmp_path, "\n".join(levels) + "\ntrainer:\n  max_epochs: 1\n")
    line = one_line_error(["fit", "--config", QUICKSTART, "--config", config], capsys)
    assert f"aliases expand to more than {MAX_EXPANDED_NODES} nodes" in line, line


def test_a_few_aliases_within_the_bound_still_load(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = _config(tmp_path, "trainer:\n  max_epochs: &rounds 1\n  min_epochs: *rounds\n  logger: false\n")
    main(["fit", "--config", QUICKSTART, *FAST, "--config", config])
    assert "error:" not in capsys.readouterr().err


@pytest.mark.parametrize(
    ("number", "reason"),
    [
        (errno.EACCES, "permission denied"),
        (errno.EROFS, "read-only file system"),
        (errno.EFBIG, r"file too large for the process's file size limit \(ulimit -f\)"),
        (errno.ENOSPC, "no space left on the device"),
    ],
)
def test_an_unwritable_file_is_one_error_line_naming_it(number: int, reason: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info, file_system_errors():
        raise OSError(number, "raw", "/runs/logs/metrics.csv")
    assert exit_info.value.code == 1
    assert re.fullmatch(rf"error: cannot write /runs/logs/metrics\.csv: {reason}.*\.\n", capsys.readouterr().err)


def test_an_unwritable_default_root_dir_is_one_error_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where a folder should be")
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", QUICKSTART, *FAST, "--trainer.logger", "false", "--trainer.default_root_dir", str(blocked / "runs")])
    err = capsys.readouterr().err
    assert exit_info.value.code in (1, 2) and "Traceback" not in err
    assert [line for line in err.splitlines() if line.startswith("error: ")] == [line for line in err.splitlines() if "blocked" in line], err
