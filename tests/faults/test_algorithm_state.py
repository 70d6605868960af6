"""Issue 25 item 5: tampered algorithm state in a checkpoint is refused on load, naming the file and
the entry, by one check for every algorithm; every exported algorithm resumes from its own checkpoints."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from fl_lightning import FedAvg, FedSoft, FedStaleWeight, ServerAdam
from fl_lightning.checkpointing.checkpoint_io import CheckpointError

from ..checkpoint_files import load_checkpoint_file
from .aggregate_helpers import same, tiny_data, tiny_trainer
from .algorithm_cases import CASES


def fit(folder: Path, make_algorithm: Callable[[], Any], case: dict[str, Any], rounds: int, ckpt_path: Path | None = None):
    torch.manual_seed(0)  # the masked models draw their initial weights unseeded
    model = case["model"]()
    saver = ModelCheckpoint(dirpath=folder, save_last=True, save_top_k=0)
    trainer = tiny_trainer(max_epochs=rounds, algorithm=make_algorithm(), callbacks=[saver], enable_checkpointing=True)
    trainer.fit(model, datamodule=tiny_data(**case.get("data", {})), ckpt_path=ckpt_path)
    return model


@pytest.mark.parametrize("cls", list(CASES), ids=[c.__name__ for c in CASES])
def test_every_algorithm_resumes_from_its_own_checkpoint_bit_exact(tmp_path: Path, cls: type) -> None:
    make_algorithm, case = CASES[cls]
    reference = fit(tmp_path / "reference", make_algorithm, case, rounds=3)
    fit(tmp_path / "run", make_algorithm, case, rounds=2)
    resumed = fit(tmp_path / "resumed", make_algorithm, case, rounds=3, ckpt_path=tmp_path / "run" / "last.ckpt")
    assert same(resumed.state_dict(), reference.state_dict())


def adam() -> FedAvg:
    return FedAvg(server_optimizer=ServerAdam(lr=0.05))


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("adam")
    fit(folder, adam, CASES[FedAvg][1], rounds=2)
    return folder / "last.ckpt"


def _nan_weight(state: dict) -> None:
    state["state_dict"]["net.1.weight"][0, 0] = float("nan")


def _federated(state: dict) -> dict:
    return state["loops"]["fit_loop"]["state_dict"]["federated"]


TAMPERINGS: dict[str, tuple[Callable[[dict], None], str]] = {
    "nan-global-weight": (_nan_weight, r"the global model's `net\.1\.weight` holds NaN or Inf"),
    "inf-server-moment": (
        lambda s: _federated(s)["algorithm"]["server_optimizer"]["v"]["net.1.bias"].fill_(float("inf")),
        r"algorithm state `algorithm\.server_optimizer\.v\.net\.1\.bias` holds NaN or Inf",
    ),
    "nan-server-momentum": (
        lambda s: _federated(s)["algorithm"]["server_optimizer"]["m"]["net.1.weight"].fill_(float("nan")),
        r"algorithm state `algorithm\.server_optimizer\.m\.net\.1\.weight` holds NaN or Inf",
    ),
    "reshaped-moment": (
        lambda s: _federated(s)["algorithm"]["server_optimizer"]["m"].update({"net.1.weight": torch.zeros(3, 2)}),
        r"algorithm state `algorithm\.server_optimizer\.m\.net\.1\.weight` has shape \[3, 2\], "
        r"but the model's `net\.1\.weight` has \[2, 3\]",
    ),
    "unknown-client": (
        lambda s: _federated(s)["history"][1].append(7),
        r"`history\[1\]` names client 7, but this federation has clients 0\.\.3",
    ),
}


@pytest.mark.parametrize("tampering", list(TAMPERINGS))
def test_tampered_state_is_one_error_naming_file_and_entry(checkpoint: Path, tmp_path: Path, tampering: str) -> None:
    change, message = TAMPERINGS[tampering]
    state = load_checkpoint_file(checkpoint)
    change(state)
    path = tmp_path / "tampered.ckpt"
    torch.save(state, path)
    with pytest.raises(CheckpointError, match=rf"^Checkpoint {path}: {message}"):
        fit(tmp_path / "resumed", adam, CASES[FedAvg][1], rounds=3, ckpt_path=path)


#: Per-client state of each algorithm that remembers clients, and the error a foreign id gives.
PER_CLIENT_STATE: dict[type, tuple[Callable[[dict], None], str]] = {
    FedStaleWeight: (lambda a: a["tracker"]["count"].update({99: 1}), r"`tracker\.count` names client 99"),
    FedSoft: (lambda a: a["models"]["entries"].update({99: {}}), r"`models` names client 99"),
}


@pytest.mark.parametrize("cls", list(PER_CLIENT_STATE), ids=[c.__name__ for c in PER_CLIENT_STATE])
def test_per_client_state_of_an_unknown_client_is_refused(tmp_path: Path, cls: type) -> None:
    make_algorithm, case = CASES[cls]
    fit(tmp_path / "run", make_algorithm, case, rounds=2)
    change, message = PER_CLIENT_STATE[cls]
    state = load_checkpoint_file(tmp_path / "run" / "last.ckpt")
    change(_federated(state)["algorithm"])
    path = tmp_path / "tampered.ckpt"
    torch.save(state, path)
    with pytest.raises(CheckpointError, match=rf"^Checkpoint {path}: .*{message}, but this federation has clients 0\.\.3"):
        fit(tmp_path / "resumed", make_algorithm, case, rounds=3, ckpt_path=path)
