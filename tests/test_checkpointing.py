"""Checkpoints: one per round named by round, ``ckpt_path="last"`` across runs, the global model in ``state_dict``."""

from __future__ import annotations

import csv
import errno
import os
import re
import warnings
from pathlib import Path

import pytest
import torch
from lightning.pytorch.loggers import CSVLogger

from fl_lightning import FedBuff, FederatedCallback
from fl_lightning.checkpointing import RoundCheckpoint
from fl_lightning.participation import ConstantDelay
from fl_lightning.checkpointing.checkpoint_io import CheckpointWriteError
from fl_lightning.checkpointing.fingerprint import ResumeMismatchError
from fl_lightning.models import MLP
from tests.integration.conftest import QUIET, digits_data, quiet_trainer

CHECKPOINTING = {**QUIET, "enable_checkpointing": True}


def _model() -> MLP:
    torch.manual_seed(0)
    return MLP(in_features=64, hidden=[16])


def _fit(tmp_path: Path, rounds: int, *, model: MLP | None = None, ckpt_path: str | None = None, **kwargs) -> tuple[MLP, Path]:
    logger = CSVLogger(tmp_path, name="exp")
    model = model or _model()
    trainer = quiet_trainer(**{**CHECKPOINTING, "logger": logger, "max_epochs": rounds, "clients_per_round": 3, **kwargs})
    trainer.fit(model, datamodule=digits_data(num_clients=6), ckpt_path=ckpt_path)
    return model, Path(logger.log_dir) / "checkpoints"


def test_the_default_checkpoint_is_named_by_round_and_linked_as_last(tmp_path: Path) -> None:
    _, checkpoints = _fit(tmp_path, rounds=3)
    assert sorted(p.name for p in checkpoints.iterdir()) == ["last.ckpt", "round_1.ckpt", "round_2.ckpt"]
    saved = torch.load(checkpoints / "last.ckpt", weights_only=False)
    assert saved["loops"]["fit_loop"]["state_dict"]["federated"]["rounds_done"] == 3
    # Saved under ModelCheckpoint's key, as before RoundCheckpoint: older checkpoints resume alike.
    assert [key for key in saved["callbacks"] if "Checkpoint" in key and key.startswith("ModelCheckpoint{")]


def test_ckpt_path_last_resumes_the_previous_run_of_the_experiment(tmp_path: Path) -> None:
    uninterrupted, _ = _fit(tmp_path / "a", rounds=3)
    _fit(tmp_path / "b", rounds=2)
    logger = CSVLogger(tmp_path / "b", name="exp")  # a new run: a new version folder
    resumed = _model()
    trainer = quiet_trainer(**{**CHECKPOINTING, "logger": logger, "max_epochs": 3, "clients_per_round": 3})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(resumed, datamodule=digits_data(num_clients=6), ckpt_path="last")
    noise = [str(w.message) for w in caught if "dirpath has changed" in str(w.message) or "add the following callbacks" in str(w.message)]
    assert not noise
    assert Path(logger.log_dir).name == "version_1"
    rows = list(csv.DictReader((Path(logger.log_dir) / "metrics.csv").open()))
    assert [float(r["round"]) for r in rows if r.get("round")] == [2.0]  # only the round left to run
    for name, value in uninterrupted.state_dict().items():
        torch.testing.assert_close(resumed.state_dict()[name], value, rtol=0, atol=0, msg=name)


class _SaveMidRound(FederatedCallback):
    """Saves a checkpoint after round 1's first client, and remembers the global model then."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.global_state: dict[str, torch.Tensor] = {}
        self.client_state: dict[str, torch.Tensor] = {}

    def on_clients_selected(self, trainer, pl_module, round_idx, client_ids) -> None:
        if round_idx == 1:
            self.global_state = {k: v.clone() for k, v in pl_module.state_dict().items()}

    def on_client_end(self, trainer, pl_module, client, update) -> None:
        if client.round_idx == 1 and not self.client_state:
            self.client_state = {k: v.clone() for k, v in pl_module.state_dict().items()}
            trainer.save_checkpoint(self.path)


def test_a_mid_round_checkpoint_holds_the_global_model_and_the_client_apart(tmp_path: Path) -> None:
    saver = _SaveMidRound(tmp_path / "mid.ckpt")
    quiet_trainer(max_epochs=2, clients_per_round=3, callbacks=[saver]).fit(_model(), datamodule=digits_data(num_clients=6))
    checkpoint = torch.load(saver.path, weights_only=False)
    federated = checkpoint["loops"]["fit_loop"]["state_dict"]["federated"]
    loaded = MLP.load_from_checkpoint(saver.path)
    for name, value in saver.global_state.items():
        torch.testing.assert_close(loaded.state_dict()[name], value, rtol=0, atol=0, msg=name)
        torch.testing.assert_close(federated["client_state"][name], saver.client_state[name], rtol=0, atol=0, msg=name)
    assert any(not torch.equal(saver.client_state[n], v) for n, v in saver.global_state.items())


def test_every_round_is_checkpointed_when_validation_is_less_frequent(tmp_path: Path) -> None:
    seen: list[int] = []

    class Rounds(FederatedCallback):
        def on_train_epoch_start(self, trainer, pl_module) -> None:  # the previous round's is saved by now
            if trainer.current_epoch:
                seen.append(torch.load(checkpoints / "last.ckpt", weights_only=False)["epoch"])

    checkpoints = tmp_path / "exp" / "version_0" / "checkpoints"
    _, folder = _fit(tmp_path, rounds=7, check_val_every_n_epoch=5, callbacks=[Rounds()])
    assert folder == checkpoints
    assert sorted(p.name for p in folder.iterdir()) == ["last.ckpt", "round_5.ckpt", "round_6.ckpt"]
    assert seen == list(range(6))


def test_an_asynchronous_run_is_checkpointed_after_its_first_and_last_aggregation_and_every_minute(tmp_path: Path) -> None:
    seen: list[int] = []

    class Aggregations(FederatedCallback):
        def on_train_epoch_start(self, trainer, pl_module) -> None:
            if trainer.current_epoch:
                seen.append(torch.load(folder / "last.ckpt", weights_only=False)["epoch"])

    folder = tmp_path / "exp" / "version_0" / "checkpoints"
    algorithm = FedBuff(buffer_size=2, delays=ConstantDelay(1.0))
    _fit(tmp_path, rounds=5, algorithm=algorithm, callbacks=[Aggregations()])  # 5 aggregations in well under 60 s
    assert seen == [0, 0, 0, 0]
    assert torch.load(folder / "last.ckpt", weights_only=False)["epoch"] == 4
    with pytest.raises(ValueError, match=r"`every_s` must be a finite number of seconds >= 0, got -1"):
        RoundCheckpoint(every_s=-1)


def test_ckpt_path_last_falls_back_to_the_newest_intact_round(tmp_path: Path) -> None:
    uninterrupted, _ = _fit(tmp_path / "a", rounds=3)
    _, folder = _fit(tmp_path / "b", rounds=2)
    (folder / "round_0.ckpt").write_bytes((folder / "round_1.ckpt").read_bytes())  # an older round left behind
    (folder / "last.ckpt").unlink()
    (folder / "round_1.ckpt").rename(folder / "round_1.tmp")
    (folder / "last.ckpt").symlink_to("round_9.ckpt")  # dangling
    (folder / "round_1.ckpt").write_bytes((folder / "round_1.tmp").read_bytes()[:-100])  # truncated
    (folder / "round_1.tmp").rename(folder / "round_5.ckpt")  # the newest intact round
    for state in ("dangling", "truncated"):
        if state == "truncated":
            (folder / "last.ckpt").unlink()
            (folder / "last.ckpt").write_bytes(b"PK\x03\x04 cut short")
        resumed = _model()
        with pytest.warns(UserWarning, match=rf"last\.ckpt is {state}.*: resuming from .*round_5\.ckpt"):
            _fit(tmp_path / "b", rounds=3, ckpt_path="last", model=resumed)
        for name, value in uninterrupted.state_dict().items():
            torch.testing.assert_close(resumed.state_dict()[name], value, rtol=0, atol=0, msg=name)


def test_ckpt_path_last_refuses_a_run_with_other_model_settings(tmp_path: Path) -> None:
    _fit(tmp_path, rounds=2)
    other = MLP(in_features=64, hidden=[16], lr=0.2)
    with pytest.raises(ResumeMismatchError, match=r"model\.lr: 0\.05 → 0\.2") as raised:
        _fit(tmp_path, rounds=2, ckpt_path="last", model=other)
    # Refused when the checkpoint is read, before the optimizers (whose settings are compared later) exist.
    assert "optimizer.0" not in str(raised.value)
    assert "max_epochs" not in str(raised.value)  # a finished run may be extended


def test_a_deliberate_optimizer_change_warns_that_the_restored_optimizer_state_keeps_its_settings(tmp_path: Path) -> None:
    _fit(tmp_path, rounds=2)
    other = MLP(in_features=64, hidden=[16], lr=0.2)
    with pytest.warns(UserWarning, match=r"optimizer\.0\.group\.0\.lr: 0\.05 → 0\.2\n.*restored from the checkpoint keeps"):
        _fit(tmp_path, rounds=3, ckpt_path="last", model=other, allow_resume_changes=True)
    assert other.trainer.optimizers[0].param_groups[0]["lr"] == 0.05  # what the warning says


def test_a_full_disk_is_one_error_naming_the_folder_and_keeps_the_last_round(tmp_path: Path, monkeypatch) -> None:
    _, folder = _fit(tmp_path, rounds=2)
    before = (folder / "round_1.ckpt").read_bytes()

    def full(descriptor: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    resumed = folder.parent.parent / "version_1" / "checkpoints"
    expected = rf"^Cannot write checkpoint round_2.ckpt: no space left in {re.escape(str(resumed))} "
    with pytest.raises(CheckpointWriteError, match=expected) as raised:
        _fit(tmp_path, rounds=3, ckpt_path="last")
    assert "\n" not in str(raised.value)
    assert not list(resumed.iterdir())  # no temp file left
    assert sorted(p.name for p in folder.iterdir()) == ["last.ckpt", "round_0.ckpt", "round_1.ckpt"]
    assert (folder / "last.ckpt").read_bytes() == before


def test_a_double_precision_run_resumes_bit_exactly(tmp_path: Path) -> None:
    # Lightning loads a checkpoint's weights into the module as constructed (float32) before "64-true" converts
    # it, so the float64 global model once came back rounded (about 1e-8 off after a resume).
    uninterrupted, _ = _fit(tmp_path / "a", rounds=3, precision="64-true")
    _, checkpoints = _fit(tmp_path / "b", rounds=2, precision="64-true")
    resumed, _ = _fit(tmp_path / "c", rounds=3, model=_model(), ckpt_path=str(checkpoints / "last.ckpt"), precision="64-true")
    for name, value in uninterrupted.state_dict().items():
        torch.testing.assert_close(resumed.state_dict()[name], value, rtol=0, atol=0, msg=name)
