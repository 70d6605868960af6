"""The contract between the asynchronous loop (:class:`~fl_lightning.loops.AsyncFitLoop`) and an algorithm."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar, Literal

import numpy as np
from typing_extensions import override

from fl_lightning.algorithms.shared.algorithm import Algorithm, ClientUpdate
from fl_lightning.evaluation.protocols import SupportsClientGroups
from fl_lightning.server.federation import Federation
from fl_lightning.participation.speed import DelayModel, UniformDelay
from fl_lightning.utils.checks import check_integer, optional

PullPolicy = Literal["immediate", "wait_new_version"]
TrainAt = Literal["dispatch", "arrival"]


class AsyncAlgorithm(Algorithm):
    r"""Server-side logic of an asynchronous algorithm, run on a virtual clock by
    :class:`~fl_lightning.loops.AsyncFitLoop`, which reads only what this class declares.

    ``concurrency`` clients are in flight; a client's job lasts a duration drawn from ``delays``;
    every ``buffer_size`` arrivals the loop sets each update's ``staleness`` (model versions since
    the client pulled) and calls :meth:`aggregate`, which a subclass builds on
    :meth:`buffer_weights`. When a client arrives it re-pulls (every client in flight) or an idle
    client drawn uniformly is dispatched; ``pull_policy="wait_new_version"`` parks a client whose
    model is still current until the next aggregation (afl-bench's rule).

    ``train_at="dispatch"`` (default) trains a client on the model version it pulled;
    ``"arrival"`` trains it when it arrives, on the model current then (parameter staleness 0,
    while ``staleness`` still counts the versions since its dispatch).

    Args:
        buffer_size: :math:`b`, arrivals per aggregation.
        concurrency: clients in flight (default: all clients).
        delays: compute-speed model (default U(1, 2) for everyone).
        pull_policy: ``"immediate"`` or ``"wait_new_version"``.
        train_at: ``"dispatch"`` or ``"arrival"``.
    """

    asynchronous: ClassVar[bool] = True
    batched_refusal: ClassVar[str] = (
        "it is asynchronous: the virtual-clock loop trains each client alone when it is dispatched, on the model "
        "version it pulled, so no clients train together in a round."
    )
    summary_metrics: ClassVar[dict[str, str]] = {"round/virtual_time": "final", "round/mean_staleness": "mean"}
    #: Clients in flight, resolved against the federation in :meth:`setup`.
    concurrency: int

    def __init__(
        self,
        *,
        buffer_size: int,
        concurrency: int | None = None,
        delays: DelayModel | None = None,
        pull_policy: PullPolicy = "immediate",
        train_at: TrainAt = "dispatch",
    ) -> None:
        check_integer("buffer_size", buffer_size, minimum=1)
        optional(check_integer, "concurrency", concurrency, minimum=1)
        if pull_policy not in ("immediate", "wait_new_version"):
            raise ValueError(f"`pull_policy` must be 'immediate' or 'wait_new_version', got {pull_policy!r}.")
        if train_at not in ("dispatch", "arrival"):
            raise ValueError(f"`train_at` must be 'dispatch' or 'arrival', got {train_at!r}.")
        self.buffer_size, self.concurrency_arg = buffer_size, concurrency
        self.delays = delays if delays is not None else UniformDelay(1.0, 2.0)
        self.pull_policy: PullPolicy = pull_policy
        self.train_at: TrainAt = train_at
        #: Sum of each client's aggregation weights so far (its influence on the global model).
        self.influence = np.zeros(0)

    @override
    def setup(self, federation: Federation) -> None:
        super().setup(federation)
        n = federation.num_clients
        self.concurrency = self.concurrency_arg if self.concurrency_arg is not None else n
        name = type(self).__name__
        if self.concurrency > n:
            raise ValueError(f"{name}: `concurrency={self.concurrency}` exceeds the {n} clients.")
        if self.buffer_size > self.concurrency:
            given = "" if self.concurrency_arg is not None else ", its default: every client"
            raise ValueError(
                f"{name}: `buffer_size={self.buffer_size}` exceeds `concurrency={self.concurrency}`{given} (a buffer fills "
                "from the clients in flight): set buffer_size <= concurrency."
            )
        self.delays.setup(num_clients=n, seed=federation.seed)
        if len(self.influence) != n:
            self.influence = np.zeros(n)

    @override
    def overridden_settings(self) -> dict[str, str]:
        return self.clients_per_round_overridden(
            f"an asynchronous algorithm has no rounds; concurrency={self.concurrency} clients are in flight at "
            f"once, not clients_per_round={self.federation.clients_per_round} (set `concurrency` instead)"
        )

    def client_groups(self) -> dict[str, list[int]]:
        """The speed groups of ``delays`` (:class:`~fl_lightning.participation.DelayGroups`), for
        federated evaluation; none for other delay models."""
        return dict(self.delays.client_groups()) if isinstance(self.delays, SupportsClientGroups) else {}

    @override
    def select_clients(self, round_idx: int) -> list[int]:
        raise TypeError(f"{type(self).__name__} is asynchronous: clients are dispatched by the AsyncFitLoop.")

    @abstractmethod
    def buffer_weights(self, updates: Sequence[ClientUpdate]) -> list[float]:
        """The aggregation weight of each update of a full buffer (its ``staleness`` set), in float64."""

    def record_influence(self, updates: Sequence[ClientUpdate], weights: Sequence[float]) -> None:
        """Adds each update's aggregation weight to its client's :attr:`influence`."""
        for update, weight in zip(updates, weights):
            self.influence[update.client_id] += weight

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"influence": self.influence.tolist()}

    @override
    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.influence = np.asarray(state["influence"], dtype=np.float64)
