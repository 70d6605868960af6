"""Federating a user's own LightningDataModule from the command line: ``fl_lightning.data.Federated``
in an ``fl-lightning`` config, and a user's own ``LightningCLI(..., trainer_class=FederatedTrainer)``."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from lightning.pytorch.cli import LightningCLI

from fl_lightning import FederatedTrainer
from fl_lightning.cli import FederatedCLI, main
from fl_lightning.data import Federated
from tests.data.user_project import UserDataModule, UserModule

TRAINER = {"max_epochs": 1, "logger": False, "enable_progress_bar": False, "accelerator": "cpu", "clients_per_round": 2}


pytestmark = pytest.mark.usefixtures("cli_in_tmp_path")


def test_a_config_federates_a_user_datamodule_by_class_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = {
        "seed_everything": 0,
        "trainer": TRAINER,
        "model": {"class_path": "tests.data.user_project.UserModule"},
        "data": {
            "class_path": "fl_lightning.data.Federated",
            "init_args": {
                "datamodule": {"class_path": "tests.data.user_project.UserDataModule", "init_args": {"batch_size": 2}},
                "partitioner": {"class_path": "fl_lightning.data.Dirichlet", "init_args": {"alpha": 0.5}},
                "num_clients": 4,
                "seed": 1,
            },
        },
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    fitted = []
    monkeypatch.setattr(FederatedTrainer, "fit", _recording(FederatedTrainer.fit, fitted))
    main(["fit", "--config", str(path)])
    trainer, model, data = fitted[0]
    assert trainer.current_epoch == 1 and len(trainer.fit_loop.history[0]) == 2
    assert isinstance(data, Federated) and isinstance(data.datamodule, UserDataModule)
    expected = Federated(UserDataModule(batch_size=2), partitioner=data.partitioner, num_clients=4, seed=1)
    assert [data.client_indices(c).tolist() for c in range(4)] == [expected.client_indices(c).tolist() for c in range(4)]
    assert (data.batch_size, data.drop_last) == (2, True)
    assert set(model.trained) == {2}  # the user's dict collate_fn, in the user's batch size


def test_fl_lightning_federates_a_plain_datamodule_with_the_trainers_num_clients(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["fit", "--seed_everything", "0", "--model", "tests.data.user_project.UserModule",
            "--data", "tests.data.user_project.UserDataModule", "--trainer.num_clients", "4"]
    args += [f"--trainer.{key}={value}" for key, value in TRAINER.items()]
    cli = FederatedCLI(args=args)
    assert isinstance(cli.trainer.datamodule, Federated) and cli.trainer.datamodule.num_clients == 4
    assert cli.model.trained == [4, 4, 4, 4]  # 2 clients of 10 samples, drop_last: 2 full batches each
    assert "Federated fit summary" in capsys.readouterr().out


def test_a_users_own_lightning_cli_with_federated_trainer_fits(tmp_path: Path) -> None:
    cli = LightningCLI(
        UserModule,
        UserDataModule,
        trainer_class=FederatedTrainer,
        args=["fit", "--seed_everything", "0", "--trainer.num_clients", "5", "--trainer.max_epochs", "2", "--trainer.logger", "false",
              "--trainer.enable_progress_bar", "false", "--data.drop_last", "false"],
    )
    assert cli.trainer.current_epoch == 2 and cli.trainer.datamodule.num_clients == 5
    assert cli.model.trained == [4, 4] * 10  # 8 samples per client in batches of 4, 5 clients, 2 rounds
    assert "val_loss" in cli.trainer.callback_metrics


def _recording(fit, calls: list):
    """``fit`` that records ``(trainer, model, datamodule)``."""

    def recorded(trainer, model, *args, datamodule=None, **kwargs):
        fit(trainer, model, *args, datamodule=datamodule, **kwargs)
        calls.append((trainer, model, trainer.datamodule))

    return recorded
