"""One epoch = one round for Lightning's hooks, callbacks, schedulers and loggers; bad clients are dropped."""

from __future__ import annotations

import csv
import warnings

import pytest
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import CSVLogger

from fl_lightning import FedAvg, FederatedCallback, FedProx, ServerSGD
from fl_lightning.models import MLP


def fresh_model(**kwargs) -> MLP:
    torch.manual_seed(0)
    return MLP(in_features=64, hidden=(32,), lr=0.1, **kwargs)


def fit(make_data, make_trainer, model, **kwargs):
    trainer = make_trainer(**{"max_epochs": 3, "clients_per_round": 3, **kwargs})
    trainer.fit(model, datamodule=make_data())
    return trainer


@pytest.mark.parametrize(
    "variant", [FedProx(mu=0.0), FedAvg(server_optimizer=ServerSGD(lr=1.0, momentum=0.0))], ids=["fedprox-mu0", "fedavgm-0"]
)
def test_degenerate_variants_equal_fedavg_bit_for_bit(make_data, make_trainer, variant):
    reference, other = fresh_model(), fresh_model()
    fit(make_data, make_trainer, reference, algorithm=FedAvg())
    fit(make_data, make_trainer, other, algorithm=variant)
    for (name, a), b in zip(reference.state_dict().items(), other.state_dict().values()):
        assert torch.equal(a, b), name


def test_fedprox_moves_less_than_fedavg(make_data, make_trainer):
    fedavg, fedprox = fresh_model(), fresh_model()
    start = {k: v.clone() for k, v in fedavg.state_dict().items()}
    fit(make_data, make_trainer, fedavg, algorithm=FedAvg(), max_epochs=1, local_epochs=3)
    fit(make_data, make_trainer, fedprox, algorithm=FedProx(mu=10.0), max_epochs=1, local_epochs=3)
    distance = lambda m: sum((v - start[k]).norm() ** 2 for k, v in m.state_dict().items())  # noqa: E731
    assert distance(fedprox) < 0.5 * distance(fedavg)


class EpochCounter(Callback):
    def __init__(self) -> None:
        self.epoch_ends = 0
        self.lrs: list[float] = []

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self.epoch_ends += 1
        self.lrs.append(trainer.optimizers[0].param_groups[0]["lr"])


class WithScheduler(MLP):
    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=0.1)
        return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)}


def test_epoch_hooks_and_epoch_schedulers_count_rounds(make_data, make_trainer):
    torch.manual_seed(0)
    counter = EpochCounter()
    trainer = fit(make_data, make_trainer, WithScheduler(in_features=64, hidden=(8,)), callbacks=[counter], max_epochs=4)
    assert counter.epoch_ends == 4 == trainer.current_epoch
    # Stepped once per round (4 clients x 4 rounds would give 0.1 * 0.5**16).
    assert counter.lrs == pytest.approx([0.05, 0.025, 0.0125, 0.00625])


def test_each_round_logs_one_row_with_its_round_and_validation(make_data, make_trainer, tmp_path):
    logger = CSVLogger(tmp_path, name="run")
    fit(make_data, make_trainer, fresh_model(), logger=logger, max_epochs=3)
    rows = list(csv.DictReader(open(logger.experiment.metrics_file_path)))
    round_rows = [r for r in rows if r.get("round")]
    assert [int(float(r["round"])) for r in round_rows] == [0, 1, 2]
    for key in ("val_acc", "val_loss", "round/clients", "round/train_loss", "round/upload_bytes"):
        assert all(r.get(key) for r in round_rows), key
        # Nowhere else: validation is part of the round's row, not a row of its own.
        assert sum(bool(r.get(key)) for r in rows) == 3, key
    assert [float(r["round/clients"]) for r in round_rows] == [3.0, 3.0, 3.0]
    hparams = open(tmp_path / "run" / "version_0" / "hparams.yaml").read()
    assert "fl/algorithm: FedAvg" in hparams


class StepLogger(MLP):
    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        self.log("step_loss", loss, on_step=True, on_epoch=False)
        return loss


def test_per_step_metrics_follow_the_optimizer_steps_and_log_every_n_steps(make_data, make_trainer, tmp_path):
    """Per-step rows sit at the optimizer step (over all clients), every ``log_every_n_steps``;
    each round's row sits at its last step, so the step column only grows down the file."""
    torch.manual_seed(0)
    logger = CSVLogger(tmp_path, name="run")
    fit(make_data, make_trainer, StepLogger(in_features=64, hidden=(8,)), logger=logger, max_epochs=3,
        local_steps=2, log_every_n_steps=4)  # fmt: skip
    rows = list(csv.DictReader(open(logger.experiment.metrics_file_path)))
    steps = [int(r["step"]) for r in rows]
    assert steps == sorted(steps)
    # 3 clients x 2 steps = 6 optimizer steps per round, 18 in all: steps 3, 7, 11, 15 are logged.
    assert [int(r["step"]) for r in rows if r.get("step_loss")] == [3, 7, 11, 15]
    assert [(int(r["step"]), int(float(r["round"]))) for r in rows if r.get("round")] == [(5, 0), (11, 1), (17, 2)]


class PoisonOneClient(FederatedCallback):
    """Makes one client's training diverge to NaN."""

    def __init__(self, victim: int | None) -> None:
        self.victim = victim

    def on_client_start(self, trainer, pl_module, client) -> None:
        pl_module.poisoned = client.client_id == self.victim or self.victim is None


class Poisonable(MLP):
    poisoned = False

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        return loss * float("nan") if self.poisoned else loss


def test_non_finite_client_is_dropped_and_counted(make_data, make_trainer):
    torch.manual_seed(0)
    model = Poisonable(in_features=64, hidden=(8,))
    victim = 2
    trainer = make_trainer(max_epochs=1, clients_per_round=8, callbacks=[PoisonOneClient(victim)])
    with pytest.warns(UserWarning, match=f"client {victim} sent a non-finite update"):
        trainer.fit(model, datamodule=make_data())
    assert all(torch.isfinite(v).all() for v in model.state_dict().values() if v.is_floating_point())
    assert trainer.callback_metrics["round/dropped_clients"] == 1
    assert trainer.callback_metrics["round/aggregated_clients"] == 7


def test_round_with_only_bad_clients_leaves_model_unchanged(make_data, make_trainer):
    torch.manual_seed(0)
    model = Poisonable(in_features=64, hidden=(8,))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    trainer = make_trainer(max_epochs=1, clients_per_round=4, callbacks=[PoisonOneClient(None)])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(model, datamodule=make_data())
    assert any("global model is unchanged" in str(w.message) for w in caught)
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k


def test_optimizer_state_reset_per_client(make_data, make_trainer):
    reset, kept = fresh_model(momentum=0.9), fresh_model(momentum=0.9)
    fit(make_data, make_trainer, reset, reset_optimizer=True)
    fit(make_data, make_trainer, kept, reset_optimizer=False)
    assert not torch.equal(reset.net[1].weight, kept.net[1].weight)


@pytest.mark.parametrize("executor", ["lightning", "lean", "batched"])
def test_round_rows_sit_at_the_same_steps_under_every_executor(make_data, make_trainer, tmp_path, executor):
    logger = CSVLogger(tmp_path, name="run")
    fit(make_data, make_trainer, fresh_model(), logger=logger, max_epochs=2, local_steps=2, client_executor=executor)
    rows = list(csv.DictReader(open(logger.experiment.metrics_file_path)))
    assert [(int(r["step"]), int(float(r["round"]))) for r in rows if r.get("round")] == [(5, 0), (11, 1)]
