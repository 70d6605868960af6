"""Issue 39 item 9: every Trainer / FederatedTrainer argument is in the resume fingerprint or listed, with its
reason, as one that does not change the numbers; the fingerprint is checked before any state is loaded."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from fl_lightning import FederatedTrainer
from fl_lightning.checkpointing.checkpoint_io import CheckpointError
from fl_lightning.checkpointing.fingerprint import (
    FEDERATED_SETTINGS,
    NOT_IN_FINGERPRINT,
    TRAINER_SETTINGS,
    ResumeMismatchError,
)
from fl_lightning.models import MLP

from .faults.aggregate_helpers import tiny_data, tiny_trainer


def arguments(cls: type) -> set[str]:
    parameters = inspect.signature(cls.__init__).parameters.values()
    return {p.name for p in parameters if p.name != "self" and p.kind is not inspect.Parameter.VAR_KEYWORD}


def test_every_trainer_argument_is_fingerprinted_or_says_why_not() -> None:
    every = arguments(pl.Trainer) | arguments(FederatedTrainer)
    tables = [set(TRAINER_SETTINGS), set(FEDERATED_SETTINGS), set(NOT_IN_FINGERPRINT)]
    assert set.union(*tables) == every, f"unlisted: {sorted(every - set.union(*tables))}, unknown: {sorted(set.union(*tables) - every)}"
    assert sum(map(len, tables)) == len(every), "an argument is in two tables"
    assert all(NOT_IN_FINGERPRINT.values()), "each exclusion says why"


def model(hidden: tuple[int, ...] = (4,)) -> MLP:
    torch.manual_seed(0)
    return MLP(in_features=3, hidden=hidden, num_classes=2, lr=0.1)


def fit(folder: Path, rounds: int, *, net: MLP | None = None, ckpt_path: Path | None = None, **kwargs: Any) -> MLP:
    net = net or model()
    saver = ModelCheckpoint(dirpath=folder, save_last=True, save_top_k=0)
    trainer = tiny_trainer(max_epochs=rounds, callbacks=[saver], enable_checkpointing=True, **kwargs)
    trainer.fit(net, datamodule=tiny_data(), ckpt_path=ckpt_path)
    return net


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("fingerprint")
    fit(folder, rounds=1)
    return folder / "last.ckpt"


def test_the_checkpoint_records_every_fingerprinted_argument(checkpoint: Path) -> None:
    saved = torch.load(checkpoint, weights_only=True)["loops"]["fit_loop"]["state_dict"]["federated"]["fingerprint"]
    assert {f"trainer.{name}" for name in TRAINER_SETTINGS} <= set(saved)
    assert saved["trainer.precision"] == "32-true" and saved["trainer.gradient_clip_algorithm"] is None
    # parameters.* is recorded only when a tensor is frozen or local (tests/test_federated_parameters.py).
    recorded = [e for e in FEDERATED_SETTINGS.values() if e != "parameters"]
    assert [e for e in recorded if not any(k == e or k.startswith(f"{e}.") for k in saved)] == []


@pytest.mark.parametrize(
    ("change", "line"),
    [
        ({"gradient_clip_val": 0.5}, "trainer.gradient_clip_val: None → 0.5"),
        ({"gradient_clip_val": 1.0, "gradient_clip_algorithm": "value"}, "trainer.gradient_clip_algorithm: None → 'value'"),
        ({"accumulate_grad_batches": 2}, "trainer.accumulate_grad_batches: 1 → 2"),
        ({"limit_train_batches": 0.5}, "trainer.limit_train_batches: 1.0 → 0.5"),
        ({"overfit_batches": 1}, "trainer.overfit_batches: 0.0 → 1"),
        ({"precision": "64-true"}, "trainer.precision: '32-true' → '64-true'"),
        ({"limit_val_batches": 1}, "trainer.limit_val_batches: 0 → 1"),
    ],
    ids=lambda v: next(iter(v)) if isinstance(v, dict) else None,
)
def test_a_changed_trainer_setting_is_refused(checkpoint: Path, tmp_path: Path, change: dict[str, Any], line: str) -> None:
    with pytest.raises(ResumeMismatchError, match=f"Cannot resume from {checkpoint}") as raised:
        fit(tmp_path, rounds=2, ckpt_path=checkpoint, **change)
    assert f"\n  {line}\n" in str(raised.value)


def test_another_model_size_is_the_fingerprint_error_before_any_weight_is_loaded(checkpoint: Path, tmp_path: Path) -> None:
    wider = model(hidden=(8,))
    before = {k: v.clone() for k, v in wider.state_dict().items()}
    with pytest.raises(ResumeMismatchError, match=r"\n  model\.hidden: \[4\] → \[8\]\n"):
        fit(tmp_path, rounds=2, net=wider, ckpt_path=checkpoint)
    assert all(torch.equal(before[k], v) for k, v in wider.state_dict().items())  # nothing restored


def test_a_deliberate_change_of_the_model_size_is_one_error_not_a_traceback(checkpoint: Path, tmp_path: Path) -> None:
    with pytest.warns(UserWarning, match="deliberate changes"), pytest.raises(CheckpointError) as raised:
        fit(tmp_path, rounds=2, net=model(hidden=(8,)), ckpt_path=checkpoint, allow_resume_changes=True)
    assert str(raised.value) == (
        f"Checkpoint {checkpoint}: its `net.1.weight` has shape [4, 3], but the model's has [8, 3]: a resume cannot "
        "change the model's shapes, even with allow_resume_changes=True."
    )
