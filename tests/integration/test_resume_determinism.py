"""Same seed => same weights and client sets; resuming from a checkpoint => same final weights."""

from __future__ import annotations

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from fl_lightning import FedAvg, FedBuff, ServerAdam
from fl_lightning.models import MLP
from fl_lightning.participation import ConstantDelay
from tests.recording_logger import RecordingLogger

ROUNDS = 4


def fresh_model() -> MLP:
    torch.manual_seed(0)
    return MLP(in_features=64, hidden=(32,), lr=0.1, momentum=0.9)


def adam_fedavg() -> FedAvg:
    # Server state (Adam moments) must survive the checkpoint too.
    return FedAvg(server_optimizer=ServerAdam(lr=0.05))


def assert_same_weights(a: torch.nn.Module, b: torch.nn.Module) -> None:
    for (name, x), y in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(x, y), name


def test_same_seed_same_weights_and_clients(make_data, make_trainer):
    runs = []
    for _ in range(2):
        model, trainer = fresh_model(), make_trainer(max_epochs=3, clients_per_round=3, seed=11, algorithm=adam_fedavg())
        trainer.fit(model, datamodule=make_data())
        runs.append((model, trainer.fit_loop.history))
    assert runs[0][1] == runs[1][1]
    assert len(runs[0][1]) == 3 and all(len(c) == 3 for c in runs[0][1])
    assert_same_weights(runs[0][0], runs[1][0])

    other, trainer = fresh_model(), make_trainer(max_epochs=3, clients_per_round=3, seed=12, algorithm=adam_fedavg())
    trainer.fit(other, datamodule=make_data())
    assert trainer.fit_loop.history != runs[0][1]


def test_resume_from_round_boundary(make_data, make_trainer, tmp_path):
    uninterrupted = fresh_model()
    checkpoints = ModelCheckpoint(dirpath=tmp_path, every_n_epochs=1, save_top_k=-1, filename="{epoch}")
    trainer = make_trainer(
        max_epochs=ROUNDS, clients_per_round=3, algorithm=adam_fedavg(), callbacks=[checkpoints], enable_checkpointing=True
    )
    trainer.fit(uninterrupted, datamodule=make_data())
    history = trainer.fit_loop.history

    resumed = fresh_model()
    trainer = make_trainer(max_epochs=ROUNDS, clients_per_round=3, algorithm=adam_fedavg())
    trainer.fit(resumed, datamodule=make_data(), ckpt_path=tmp_path / "epoch=1.ckpt")  # after round 2 of 4
    assert trainer.current_epoch == ROUNDS
    assert trainer.fit_loop.history == history
    assert_same_weights(uninterrupted, resumed)


def test_resume_from_mid_round_checkpoint(make_data, make_trainer, tmp_path):
    uninterrupted = fresh_model()
    trainer = make_trainer(max_epochs=ROUNDS, clients_per_round=3, algorithm=adam_fedavg())
    trainer.fit(uninterrupted, datamodule=make_data())

    # A checkpoint every 7 optimizer steps lands inside clients, where the module holds a
    # client's weights; the loop must save and restore the global model itself.
    mid = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=7, save_top_k=-1, filename="{step}")
    interrupted = fresh_model()
    trainer = make_trainer(
        max_epochs=2, clients_per_round=3, algorithm=adam_fedavg(), callbacks=[mid], enable_checkpointing=True
    )
    trainer.fit(interrupted, datamodule=make_data())
    last = max(tmp_path.glob("step=*.ckpt"), key=lambda p: int(p.stem.split("=")[1]))
    assert "global_state" in torch.load(last, weights_only=False)["loops"]["fit_loop"]["state_dict"]["federated"]

    resumed = fresh_model()
    trainer = make_trainer(max_epochs=ROUNDS, clients_per_round=3, algorithm=adam_fedavg())
    trainer.fit(resumed, datamodule=make_data(), ckpt_path=last)
    assert_same_weights(uninterrupted, resumed)


@pytest.mark.parametrize("algorithm", ["fedavg", "fedbuff"])
def test_a_mid_round_resume_logs_the_uninterrupted_step_column(make_data, make_trainer, tmp_path, algorithm):
    """The round rows' ``step`` (the round's last optimizer step) after a resume from a checkpoint
    saved inside a round equals the uninterrupted run's: the replayed round does not count twice.
    FedBuff's checkpoint falls after an aggregation, while clients train at dispatch: the
    aggregation is replayed, not skipped (it was: one aggregation short, other weights)."""
    make = {"fedavg": adam_fedavg, "fedbuff": lambda: FedBuff(buffer_size=2, delays=ConstantDelay(1.0))}[algorithm]

    def run(rounds: int, ckpt_path=None, **kwargs) -> tuple[MLP, list[tuple[int | None, float]]]:
        logger, model = RecordingLogger(), fresh_model()
        trainer = make_trainer(max_epochs=rounds, clients_per_round=3, algorithm=make(), logger=logger, **kwargs)
        trainer.fit(model, datamodule=make_data(), ckpt_path=ckpt_path)
        return model, [(step, metrics["round"]) for step, metrics in logger.records if "round" in metrics]

    model, uninterrupted = run(ROUNDS)
    mid = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=7, save_top_k=-1, filename="{step}")
    run(2, callbacks=[mid], enable_checkpointing=True)
    last = max(tmp_path.glob("step=*.ckpt"), key=lambda p: int(p.stem.split("=")[1]))
    federated = torch.load(last, weights_only=False)["loops"]["fit_loop"]["state_dict"]["federated"]
    assert "round_start_steps" in federated
    resumed_model, resumed = run(ROUNDS, ckpt_path=last)
    assert resumed and resumed == uninterrupted[len(uninterrupted) - len(resumed) :]
    assert_same_weights(model, resumed_model)
