"""FederatedTrainer's construction: the loop it installs, its callbacks, and its defaults
(argument errors: ``test_trainer_errors.py``; federating a plain datamodule: ``test_trainer_federates.py``)."""

from __future__ import annotations

from lightning.pytorch.callbacks import ModelCheckpoint

from fl_lightning import FedAsync, FedAvg, FedBuff, FederatedTrainer, FedProx
from fl_lightning._lightning_compat import ClientEpochLoop
from fl_lightning.callbacks.client_loss import ClientLossRecorder
from fl_lightning.callbacks.progress import FederatedProgressBar
from fl_lightning.checkpointing import GlobalModelCheckpoint
from fl_lightning.distributed.strategy import FederatedDDPStrategy
from fl_lightning.loops import AsyncFitLoop, FederatedFitLoop

from .quiet import QUIET, quiet_trainer


def test_synchronous_algorithms_get_the_round_loop_and_asynchronous_ones_the_virtual_clock():
    for algorithm, loop in ((FedProx(mu=0.1), FederatedFitLoop), (FedBuff(), AsyncFitLoop), (FedAsync(), AsyncFitLoop)):
        trainer = quiet_trainer(algorithm=algorithm)
        assert type(trainer.fit_loop) is loop and trainer.algorithm is algorithm
        assert isinstance(trainer.fit_loop.epoch_loop, ClientEpochLoop)


def test_defaults_fedavg_one_local_epoch_every_client_seed_zero():
    loop = quiet_trainer().fit_loop
    assert type(loop.algorithm) is FedAvg
    assert (loop.local_epochs, loop.local_steps, loop.clients_per_round, loop.seed) == (1, None, 1.0, 0)
    assert loop.reset_optimizer and loop.client_executor == "auto"


def test_local_steps_replace_the_default_local_epoch():
    loop = quiet_trainer(local_steps=3).fit_loop
    assert (loop.local_epochs, loop.local_steps) == (None, 3)


def test_callbacks_installed_beside_the_users():
    mine = ModelCheckpoint(every_n_epochs=2)
    trainer = FederatedTrainer(**{**QUIET, "enable_checkpointing": True, "enable_progress_bar": True}, callbacks=mine)
    kinds = [type(c) for c in trainer.callbacks]
    assert mine in trainer.callbacks and kinds.count(ModelCheckpoint) == 1  # the user's replaces the per-round one
    assert FederatedProgressBar in kinds and ClientLossRecorder in kinds and GlobalModelCheckpoint in kinds
    quiet = [type(c) for c in quiet_trainer().callbacks]
    assert FederatedProgressBar not in quiet and ModelCheckpoint not in quiet and ClientLossRecorder in quiet


def test_ddp_becomes_the_federated_ddp_strategy():
    trainer = quiet_trainer(strategy="ddp", devices=1)
    assert isinstance(trainer.strategy, FederatedDDPStrategy)
