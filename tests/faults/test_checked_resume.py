"""Issue 15 item 7: a resume from a mismatched, tampered, truncated or foreign checkpoint is refused clearly."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from fl_lightning import FedAvg, FedBuff, ServerAdam, ServerSGD
from fl_lightning.checkpointing.checkpoint_io import CheckpointError
from fl_lightning.checkpointing.fingerprint import ResumeMismatchError, fingerprint_differences

from .aggregate_helpers import RoundRecorder, tiny_data, tiny_model, tiny_trainer

SAVED = {"clients_per_round": 2, "seed": 5}


def fedavg_sgd() -> FedAvg:
    return FedAvg(server_optimizer=ServerSGD(lr=1.0))


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A checkpoint after 2 rounds of FedAvg (server SGD) on 4 clients, 2 per round, seed 5."""
    folder = tmp_path_factory.mktemp("ckpt")
    saver = ModelCheckpoint(dirpath=folder, save_last=True, save_top_k=0)
    trainer = tiny_trainer(max_epochs=2, algorithm=fedavg_sgd(), callbacks=[saver], enable_checkpointing=True, **SAVED)
    trainer.fit(tiny_model(), datamodule=tiny_data())
    return folder / "last.ckpt"


def resume(path: Path, *, num_clients: int = 4, **kwargs: Any) -> RoundRecorder:
    recorder = RoundRecorder()
    settings = {**SAVED, "algorithm": fedavg_sgd(), "max_epochs": 3, **kwargs}
    trainer = tiny_trainer(callbacks=[recorder], **settings)
    trainer.fit(tiny_model(), datamodule=tiny_data(num_clients), ckpt_path=path)
    return recorder


def rewritten(checkpoint: Path, folder: Path, change: Any) -> Path:
    state = torch.load(checkpoint, weights_only=False)
    change(state["loops"]["fit_loop"]["state_dict"]["federated"])
    path = folder / "rewritten.ckpt"
    torch.save(state, path)
    return path


def test_unchanged_resume_runs_the_remaining_round(checkpoint):
    assert len(resume(checkpoint).metrics) == 1


def test_every_difference_is_listed_in_one_error(checkpoint):
    with pytest.raises(ResumeMismatchError) as raised:
        resume(checkpoint, num_clients=8, clients_per_round=3, algorithm=FedAvg(server_optimizer=ServerAdam(lr=0.05)))
    message = str(raised.value)
    assert f"Cannot resume from {checkpoint}" in message
    for line in (
        "num_clients: 4 → 8",
        "clients_per_round: 2 → 3",
        "algorithm.server_optimizer: 'ServerSGD' → 'ServerAdam'",
        "algorithm.server_optimizer.lr: 1.0 → 0.05",
        "algorithm.server_optimizer.momentum: 0.0 → '<absent>'",
        "algorithm.server_optimizer.beta1: '<absent>' → 0.9",
    ):
        assert f"  {line}\n" in message
    assert "partition: 'indices:" in message
    assert "seed" not in message.split("(saved → now):")[1].split("Resume with")[0]
    assert "allow_resume_changes=True" in message


@pytest.mark.parametrize(
    ("change", "line"),
    [
        ({"seed": 6}, "seed: 5 → 6"),
        ({"local_steps": 3}, "local_steps: 2 → 3"),
        ({"algorithm": FedAvg(server_optimizer=ServerSGD(lr=0.5))}, "algorithm.server_optimizer.lr: 1.0 → 0.5"),
        ({"algorithm": FedAvg(weighting="uniform")}, "algorithm.weighting: 'samples' → 'uniform'"),
    ],
)
def test_each_setting_is_checked(checkpoint, change, line):
    with pytest.raises(ResumeMismatchError, match=line):
        resume(checkpoint, **change)


def test_a_changed_algorithm_is_a_listed_difference_not_a_key_error(checkpoint):
    with pytest.raises(ResumeMismatchError, match="algorithm: 'FedAvg' → 'FedBuff'"):
        resume(checkpoint, algorithm=FedBuff(buffer_size=2))


def test_deliberate_changes_resume_with_a_warning(checkpoint):
    with pytest.warns(UserWarning, match=r"deliberate changes \(allow_resume_changes=True\):\n  clients_per_round: 2 → 4"):
        recorder = resume(checkpoint, clients_per_round=4, allow_resume_changes=True)
    assert recorder.metrics[0]["round/clients"] == 4


def test_opt_out_still_refuses_algorithm_state_it_cannot_load(checkpoint):
    refused = pytest.raises(CheckpointError, match="FedBuff cannot load the saved algorithm state")
    with pytest.warns(UserWarning, match="deliberate changes"), refused:
        resume(checkpoint, algorithm=FedBuff(buffer_size=2), allow_resume_changes=True)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda f: f.update(rounds_done=10**9), r"`rounds_done=1000000000` is outside 0..3 \(max_epochs\)"),
        (lambda f: f.update(rounds_done=-1), "`rounds_done=-1` is outside"),
        (lambda f: f.update(rounds_done=1.5), "`rounds_done` must be of type int, got 1.5"),
        (lambda f: f.pop("history"), "`history` must be of type list, got None"),
        (lambda f: f.update(history=[["a"]]), "`history` must be a list of lists of client ids"),
        (lambda f: f.update(total_upload_bytes=-5), "`total_upload_bytes=-5` is negative"),
        (lambda f: f.update(history_start=7), r"`history_start` must be an int in 0..2 \(rounds_done\), got 7"),
        (lambda f: f.clear(), "`rounds_done` must be of type int"),
    ],
    ids=["huge-rounds", "negative-rounds", "float-rounds", "no-history", "bad-history", "negative-bytes", "history-start", "empty"],
)
def test_tampered_state_is_refused(checkpoint, tmp_path, change, match):
    path = rewritten(checkpoint, tmp_path, change)
    with pytest.raises(CheckpointError, match=match) as raised:
        resume(path)
    assert str(path) in str(raised.value)


def test_checkpoint_without_federated_state_is_refused(checkpoint, tmp_path):
    state = torch.load(checkpoint, weights_only=False)
    del state["loops"]["fit_loop"]["state_dict"]["federated"]
    torch.save(state, tmp_path / "plain.ckpt")
    with pytest.raises(CheckpointError, match="plain.ckpt was not written by FederatedTrainer"):
        resume(tmp_path / "plain.ckpt")


def test_truncated_file_gives_one_clear_error(checkpoint, tmp_path):
    path = tmp_path / "truncated.ckpt"
    path.write_bytes(checkpoint.read_bytes()[: checkpoint.stat().st_size // 2])
    with pytest.raises(CheckpointError, match=f"Cannot read checkpoint {path}: the file is truncated, corrupt or not"):
        resume(path)


@pytest.mark.parametrize("content", [{"weights": torch.zeros(2)}, [1, 2, 3]], ids=["dict", "list"])
def test_foreign_file_gives_one_clear_error(tmp_path, content):
    path = tmp_path / "foreign.ckpt"
    torch.save(content, path)
    with pytest.raises(CheckpointError, match=f"{path} is not a Lightning checkpoint"):
        resume(path)


def test_old_checkpoint_without_fingerprint_resumes_with_a_warning(checkpoint, tmp_path):
    path = rewritten(checkpoint, tmp_path, lambda f: f.pop("fingerprint"))
    with pytest.warns(UserWarning, match="has no federation fingerprint"):
        recorder = resume(path, clients_per_round=3)  # not checked: nothing to compare with
    assert len(recorder.metrics) == 1


def test_differences_list_each_changed_entry_once():
    saved, now = {"a": 1, "b": [1, 2], "gone": "x"}, {"a": 1, "b": [1, 3], "new": None}
    assert fingerprint_differences(saved, now) == ["b: [1, 2] → [1, 3]", "new: '<absent>' → None", "gone: 'x' → '<absent>'"]
