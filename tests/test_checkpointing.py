"""Checkpoints: one per round named by round, ``ckpt_path="last"`` across runs, the global model in ``state_dict``."""

from __future__ import annotations

import csv
import warnings
from pathlib import Path

import torch
from lightning.pytorch.loggers import CSVLogger

from fl_lightning import FederatedCallback
from fl_lightning.models import MLP
from tests.integration.conftest import QUIET, digits_data, quiet_trainer

CHECKPOINTING = {**QUIET, "enable_checkpointing": True}


def _model() -> MLP:
    torch.manual_seed(0)
    return MLP(in_features=64, hidden=[16])


def _fit(tmp_path: Path, rounds: int, **kwargs) -> tuple[MLP, Path]:
    logger = CSVLogger(tmp_path, name="exp")
    model = _model()
    trainer = quiet_trainer(**{**CHECKPOINTING, "logger": logger, "max_epochs": rounds, "clients_per_round": 3, **kwargs})
    trainer.fit(model, datamodule=digits_data(num_clients=6), ckpt_path=kwargs.pop("ckpt_path", None))
    return model, Path(logger.log_dir) / "checkpoints"


def test_the_default_checkpoint_is_named_by_round_and_linked_as_last(tmp_path: Path) -> None:
    _, checkpoints = _fit(tmp_path, rounds=3)
    assert sorted(p.name for p in checkpoints.iterdir()) == ["last.ckpt", "round_2.ckpt"]
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
