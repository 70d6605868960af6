"""The :class:`~fl_lightning.server.services.ServerServices` of a running federated loop."""

from __future__ import annotations

from typing import Protocol

import lightning.pytorch as pl
from torch.optim import Optimizer
from typing_extensions import override

from fl_lightning import _lightning_compat as compat
from fl_lightning.algorithms.shared.algorithm import ClientUpdate
from fl_lightning.checkpointing import run_directory
from fl_lightning.algorithms.shared.optimizer_state import load_optimizer_state, optimizer_state_to_cpu
from fl_lightning.models.schedulers import restart_staircases
from fl_lightning.server.services import OptimizerState, ServerServices

class RunsClients(Protocol):
    """What the services need of a loop (``FederatedFitLoop``, ``AsyncFitLoop``): its trainer and its
    client training; a protocol, so that this module and the loops do not import each other."""

    trainer: pl.Trainer

    def train_client(self, round_idx: int, client_id: int, *, seed: int) -> ClientUpdate: ...

    def train_client_later(self, round_idx: int, client_id: int, *, seed: int) -> None: ...


class LoopServices(ServerServices):
    """Binds the algorithm's services to ``loop`` and its trainer: the only place an algorithm's
    request reaches the trainer."""

    def __init__(self, loop: RunsClients) -> None:
        super().__init__()
        self._loop = loop

    @override
    def optimizer_states(self) -> list[OptimizerState]:
        return [optimizer_state_to_cpu(o) for o in self._loop.trainer.optimizers]

    @override
    def load_optimizer_states(self, states: list[OptimizerState] | None) -> None:
        for i, optimizer in enumerate(self._loop.trainer.optimizers):
            load_optimizer_state(optimizer, states[i] if states else None)

    @override
    def optimizers(self) -> list[Optimizer]:
        return list(self._loop.trainer.optimizers)

    @override
    def lr_scheduler_intervals(self) -> list[str]:
        return [config.interval for config in self._loop.trainer.lr_scheduler_configs]

    @override
    def restart_lr_schedules(self, round_idx: int) -> int:
        return restart_staircases(self._loop.trainer, round_idx)

    @override
    def reload_evaluation_data(self) -> None:
        compat.reload_validation_data(self._loop.trainer)

    @override
    def run_folder(self) -> str | None:
        return run_directory(self._loop.trainer) or self._loop.trainer.default_root_dir

    @property
    @override
    def accumulate_grad_batches(self) -> int:
        return int(self._loop.trainer.accumulate_grad_batches)

    @override
    def request_stop(self) -> None:
        self._loop.trainer.should_stop = True

    @override
    def train_client(self, round_idx: int, client_id: int, *, seed: int) -> ClientUpdate:
        return self._loop.train_client(round_idx, client_id, seed=seed)

    @override
    def train_client_later(self, round_idx: int, client_id: int, *, seed: int) -> None:
        self._loop.train_client_later(round_idx, client_id, seed=seed)
