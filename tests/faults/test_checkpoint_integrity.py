"""Issue 39 items 7 and 8: a checkpoint with one flipped byte (in tensor data or in the zip directory) is never
loaded, whoever names it; ``last`` falls back to the newest intact checkpoint of any name, and with none left
it is one error naming each file, never a silent restart from round 0."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger

from fl_lightning.checkpointing.checkpoint_io import CheckpointError, read_checkpoint

from .aggregate_helpers import same, tiny_data, tiny_model, tiny_trainer
from .corrupt import FLIPS

pytestmark = pytest.mark.parametrize("flip", FLIPS.values(), ids=list(FLIPS))
#: What each flip is reported as, after "Cannot read checkpoint <path>: the file is truncated, corrupt or not a checkpoint".
REASONS = {
    FLIPS["tensor-data"]: r"\(member .*/data/\d+ fails its CRC-32 check\)\.$",
    FLIPS["zip-directory"]: r"\(its zip directory is unreadable \(UnicodeDecodeError: 'utf-8' codec can't decode",
}


def fit(tmp_path: Path, rounds: int, ckpt_path: str | Path | None = None, **kwargs) -> torch.nn.Module:
    model = tiny_model()
    logger = CSVLogger(tmp_path, name="exp")
    trainer = tiny_trainer(max_epochs=rounds, enable_checkpointing=True, logger=logger, clients_per_round=2, **kwargs)
    trainer.fit(model, datamodule=tiny_data(), ckpt_path=ckpt_path)
    return model


def rounds_folder(tmp_path: Path) -> Path:
    return tmp_path / "exp" / "version_0" / "checkpoints"


def one_line_naming(error: BaseException, path: Path) -> str:
    message = str(error)
    assert "\n" not in message and str(path) in message, message
    return message


def test_a_named_file_is_refused_before_it_is_used(tmp_path: Path, flip: Callable[[Path], None]) -> None:
    fit(tmp_path, rounds=1)
    path = tmp_path / "copy.ckpt"
    shutil.copy(rounds_folder(tmp_path) / "round_0.ckpt", path)
    flip(path)
    expected = rf"^Cannot read checkpoint {path}: the file is truncated, corrupt or not a checkpoint {REASONS[flip]}"
    for read in (
        lambda: fit(tmp_path / "resumed", rounds=2, ckpt_path=path),  # trainer.fit(ckpt_path=...)
        lambda: tiny_trainer().test(tiny_model(), datamodule=tiny_data(), ckpt_path=path),
        lambda: read_checkpoint(path),  # what the CLI reads before the trainer exists
    ):
        with pytest.raises(CheckpointError, match=expected) as raised:
            read()
        one_line_naming(raised.value, path)


def test_last_falls_back_to_the_previous_round_and_resumes_bit_exact(tmp_path: Path, flip: Callable[[Path], None]) -> None:
    reference = fit(tmp_path / "reference", rounds=3)
    fit(tmp_path, rounds=2)
    folder = rounds_folder(tmp_path)
    assert sorted(p.name for p in folder.iterdir()) == ["last.ckpt", "round_0.ckpt", "round_1.ckpt"]  # two kept
    flip(folder / "round_1.ckpt")  # last.ckpt links it
    with pytest.warns(UserWarning, match=r"last\.ckpt is (corrupt|truncated or corrupt) \(.*: resuming from .*round_0\.ckpt"):
        resumed = fit(tmp_path, rounds=3, ckpt_path="last")
    assert same(resumed.state_dict(), reference.state_dict())


def test_a_corrupt_only_checkpoint_is_an_error_not_a_restart(tmp_path: Path, flip: Callable[[Path], None]) -> None:
    fit(tmp_path, rounds=1)
    path = rounds_folder(tmp_path) / "round_0.ckpt"
    flip(path)
    with pytest.raises(CheckpointError, match=r"^No intact checkpoint to resume from in .*: .*last\.ckpt is .*round_0\.ckpt is") as raised:
        fit(tmp_path, rounds=2, ckpt_path="last")
    one_line_naming(raised.value, path)
    assert not (tmp_path / "exp" / "version_1" / "checkpoints").exists()  # nothing trained


def test_a_user_checkpoint_folder_falls_back_from_last_to_its_epoch_file(tmp_path: Path, flip: Callable[[Path], None]) -> None:
    reference = fit(tmp_path / "reference", rounds=3)
    saver = ModelCheckpoint(dirpath=tmp_path / "user", save_last=True)  # epoch=1-step=<s>.ckpt and a copy as last.ckpt
    fit(tmp_path, rounds=2, callbacks=[saver])
    (epoch_file,) = (tmp_path / "user").glob("epoch=1-step=*.ckpt")
    flip(tmp_path / "user" / "last.ckpt")
    with pytest.warns(UserWarning, match=rf"last\.ckpt is .*: resuming from {epoch_file}"):
        resumed = fit(tmp_path, rounds=3, ckpt_path="last", callbacks=[ModelCheckpoint(dirpath=tmp_path / "user", save_last=True)])
    assert same(resumed.state_dict(), reference.state_dict())
