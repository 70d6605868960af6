"""How a round's clients train: the :class:`ClientExecutor` interface and the per-client steps every executor shares.

The loop hands an executor a :class:`ClientRuntime` once per fit (what it may use: the trainer,
the algorithm, the module's tensors, each client's batch stream, the loss recorder) and, per
round, the clients' contexts and the global state; the executor returns their updates, in order.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence, Sized
from dataclasses import dataclass
from functools import cached_property

import lightning.pytorch as pl
from torch.optim import Optimizer
from typing_extensions import override

from fl_lightning.algorithms.shared.algorithm import Algorithm, ClientContext, ClientUpdate
from fl_lightning.callbacks.client_loss import ClientLossRecorder
from fl_lightning.callbacks.federated_callback import call_federated_hook
from fl_lightning.data._data_checks import ClientDataError
from fl_lightning.mixins.applied_term import check_terms_applied
from fl_lightning.server.client_tensors import ClientTensors
from fl_lightning.server.model_state import State, compute_delta, load_into
from fl_lightning.models.schedulers import RoundStepSchedules

#: PyTorch's refusal to batch-normalise one value per channel in training (a batch of one sample).
ONE_VALUE_PER_CHANNEL = "Expected more than 1 value per channel when training"


def one_sample_batch_error(client: ClientContext) -> ClientDataError:
    """The error for ``client``'s batch of one sample, which BatchNorm refuses in training (:data:`ONE_VALUE_PER_CHANNEL`)."""
    return ClientDataError(
        f"Client {client.client_id} ({client.num_samples} samples) has a batch of 1 sample in round "
        f"{client.round_idx}, which BatchNorm cannot normalise in training: set the data's drop_last=True, "
        "or a batch_size that leaves no client a last batch of 1."
    )


@dataclass(frozen=True)
class ClientRuntime:
    """What an executor gets from the loop: nothing of the loop's own state.

    Attributes:
        trainer: the trainer (its module, optimizers, strategy and precision).
        algorithm: the federated algorithm.
        live: the module's tensors by ``state_dict`` name (the loop's view of the weights).
        batches: a client's local batch stream for its round, ordered by ``client.seed``.
        recorder: the loss recorder whose means become ``client.metrics``.
        reset_optimizer: clear the optimizer state before each client.
        schedules: puts ``interval="step"`` LR schedulers back at the round's start before each client.
        client_tensors: each client's local tensors and the frozen buffers (``None``: the module has neither; never
            an empty one, which would be tested twice per client).
    """

    trainer: pl.Trainer
    algorithm: Algorithm
    live: State
    batches: Callable[[ClientContext], Sized]
    recorder: ClientLossRecorder
    reset_optimizer: bool
    schedules: RoundStepSchedules
    client_tensors: ClientTensors | None = None

    @cached_property
    def module(self) -> pl.LightningModule:
        """The trainer's LightningModule, looked up once (a chain of properties read several times per client)."""
        return self.trainer.lightning_module

    @cached_property
    def optimizers(self) -> list[Optimizer]:
        """The trainer's optimizers, looked up once: set up before the loop starts, they stay for the fit."""
        return self.trainer.optimizers


class ClientExecutor(ABC):
    """Trains a round's clients from the global state and returns their updates, in the clients' order."""

    #: The ``client_executor`` value that selects this executor.
    name: str

    def __init__(self, runtime: ClientRuntime) -> None:
        self.runtime = runtime

    @property
    def chosen(self) -> str | None:
        """The executor clients run with: :attr:`name`, except while ``"auto"`` has not decided (``None``)."""
        return self.name

    @abstractmethod
    def train(self, clients: Sequence[ClientContext], global_state: State) -> list[ClientUpdate]:
        """Trains ``clients`` (each from ``global_state``, which stays unchanged); the module is
        left holding the last client's weights."""

    def stream(self, clients: Sequence[ClientContext], global_state: State) -> Iterator[ClientUpdate]:
        """:meth:`train`'s updates, in order, each given as soon as the executor has it (a streamed aggregation,
        :mod:`~fl_lightning.algorithms.shared.folding`, frees it before the next); by default all after :meth:`train`."""
        yield from self.train(clients, global_state)

    def train_later(self, clients: Sequence[ClientContext], global_state: State) -> None:
        """Trains ``clients`` as :meth:`train` does, for a caller that does not read their updates (the algorithm's
        ``client_update`` keeps the result): by default at once; an executor may hold them to train together."""
        self.train(clients, global_state)

    def start_client(self, client: ClientContext, global_state: State) -> None:
        """The module holds the global weights, the optimizer is fresh, step LR schedulers are at the
        round's start, the algorithm has configured the client and the callbacks know it started."""
        runtime = self.runtime
        load_into(runtime.live, global_state)
        if runtime.client_tensors is not None:
            runtime.client_tensors.start(client.client_id)
        # Reset before configure_client, so that an algorithm may install per-client optimizer state.
        if runtime.reset_optimizer:
            for optimizer in runtime.optimizers:
                optimizer.state.clear()
        runtime.schedules.start_client(client.round_idx)
        runtime.algorithm.configure_client(client, runtime.module, global_state)
        call_federated_hook(runtime.trainer, "on_client_start", client)

    def finish_client(self, client: ClientContext, global_state: State) -> ClientUpdate:
        """The update of ``client`` (:meth:`compute_update`), then the callbacks know it ended (:meth:`end_client`)."""
        update = self.compute_update(client, global_state)
        self.end_client(client, update)
        return update

    def compute_update(self, client: ClientContext, global_state: State) -> ClientUpdate:
        """The update of ``client``, whose local weights the module holds (``delta = local - global``), once every
        term a mixin set was applied (before the algorithm's ``client_update``, which may unset it)."""
        runtime = self.runtime
        check_terms_applied(runtime.module, client.completed_steps, runtime.algorithm)
        if runtime.client_tensors is not None:
            runtime.client_tensors.finish(client.client_id)
        return runtime.algorithm.client_update(client, runtime.module, compute_delta(runtime.live, global_state))

    def end_client(self, client: ClientContext, update: ClientUpdate) -> None:
        """The callbacks' ``on_client_end``."""
        call_federated_hook(self.runtime.trainer, "on_client_end", client, update)


class SequentialExecutor(ClientExecutor):
    """One client after another, each through :meth:`run_steps`."""

    @override
    def train(self, clients: Sequence[ClientContext], global_state: State) -> list[ClientUpdate]:
        return list(self.stream(clients, global_state))

    @override
    def stream(self, clients: Sequence[ClientContext], global_state: State) -> Iterator[ClientUpdate]:
        for client in clients:
            yield self.train_client(client, global_state)

    def train_client(self, client: ClientContext, global_state: State) -> ClientUpdate:
        self.start_client(client, global_state)
        batches = self.runtime.batches(client)  # after configure_client, which may change the local work (Ditto)
        try:
            client.completed_steps = self.run_steps(batches) if len(batches) else 0
        except ValueError as error:
            if ONE_VALUE_PER_CHANNEL not in str(error):
                raise
            raise one_sample_batch_error(client) from error
        client.metrics.update(self.runtime.recorder.pop_means())
        return self.finish_client(client, global_state)

    @abstractmethod
    def run_steps(self, batches: Sized) -> int:
        """Runs the client's local steps over ``batches`` on the module; returns the optimizer steps taken."""
