"""What the server knows about the federation, as seen by an :class:`~fl_lightning.Algorithm`."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import lightning.pytorch as pl
import numpy as np
import torch
from torch import Tensor

from fl_lightning.server.client_tensors import ClientTensors
from fl_lightning.server.federated_parameters import FederatedParameters, ParameterKinds, shared_tensors
from fl_lightning.server.model_state import State, live_tensors, load_into
from fl_lightning.server.services import ServerServices
from fl_lightning.utils.seeding import make_generator


@runtime_checkable
class FederatedDataSource(Protocol):
    """The data a federated fit needs: a number of clients and a batch stream per client.

    :class:`~fl_lightning.data.FederatedDataModule` implements it.
    """

    @property
    def num_clients(self) -> int: ...

    def client_num_samples(self, cid: int) -> int: ...

    def client_batches(
        self,
        cid: int,
        *,
        num_epochs: int | None = None,
        num_batches: int | None = None,
        generator: torch.Generator,
        batch_size: int | None = None,
    ) -> Iterable[Any]: ...


def require_federated_data(data: object) -> FederatedDataSource:
    """``data``, or ``TypeError`` saying what a federated fit needs."""
    if not isinstance(data, FederatedDataSource):
        raise TypeError(
            "FederatedTrainer needs federated data: pass `datamodule=FederatedDataModule(...)`, or any "
            "LightningDataModule (FederatedTrainer(num_clients=..., partitioner=...) federates it), or any object "
            f"with num_clients/client_num_samples/client_batches; got {type(data).__name__}."
        )
    return data


@dataclass
class Federation:
    """The federation an algorithm runs on.

    Attributes:
        data: the clients' data.
        module: the LightningModule being trained (it holds the global weights between rounds).
        clients_per_round: clients sampled per round, resolved to a count.
        seed: root seed of every random choice of the federated loop.
        param_names: the shared ``state_dict`` names that are parameters (the rest are buffers): what a server
            optimizer steps.
        local_epochs: local epochs requested per client per round (or ``None``).
        local_steps: local optimizer steps requested per client per round (or ``None``).
        num_rounds: the run's number of rounds (``max_epochs``; ``None`` if unbounded).
        services: what the loop does for the algorithm (optimizer state, LR schedules, evaluation
            data, round metrics...; :mod:`fl_lightning.server.services`).
        kinds: which tensors are shared, frozen or local (:mod:`~fl_lightning.server.federated_parameters`;
            default: resolved from ``requires_grad``). Algorithms see and keep state for the shared ones only.
        client_tensors: each client's local tensors (kept by the loop) and the frozen buffers.
    """

    data: FederatedDataSource
    module: pl.LightningModule
    clients_per_round: int
    seed: int
    param_names: frozenset[str]
    local_epochs: int | None = None
    local_steps: int | None = None
    num_rounds: int | None = None
    services: ServerServices = field(default_factory=ServerServices)
    kinds: ParameterKinds | None = None
    client_tensors: ClientTensors | None = None
    num_samples: np.ndarray = field(init=False)
    _live: State = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.num_samples = np.array([self.data.client_num_samples(c) for c in range(self.num_clients)])
        if self.kinds is None:
            self.kinds = FederatedParameters().resolve(self.module)
        every_tensor = live_tensors(self.module)
        self._live = shared_tensors(self.kinds, every_tensor)
        if self.client_tensors is None:
            self.client_tensors = ClientTensors(self.kinds, every_tensor)

    @property
    def num_clients(self) -> int:
        return self.data.num_clients

    def generator(self, *keys: int | str) -> torch.Generator:
        """A generator seeded from ``(seed, *keys)``, e.g. ``generator("select", round_idx)``."""
        return make_generator(self.seed, *keys)

    def probe_batches(self, cid: int, batch_size: int = 512) -> Iterable[Any]:
        """One pass over client ``cid``'s training data in large batches, for loss probes."""
        return self.data.client_batches(cid, num_epochs=1, generator=self.generator("probe", cid), batch_size=batch_size)

    def local_weights(self) -> State:
        """The module's shared tensors (parameters and buffers) by ``state_dict`` name, sharing storage: during
        ``configure_client``/``client_update``, the training client's weights. Frozen tensors and aliases of
        tied ones are not in it; a client's local tensors neither (the loop keeps those)."""
        return self._live

    def load_local_weights(self, state: Mapping[str, Tensor]) -> None:
        """Loads ``state`` into the module in place (a client's personalised model, a cluster centre),
        after the loop has loaded the global weights and before the client trains."""
        load_into(self._live, state)
