"""A base for algorithms that wrap another and change one part of it (privacy, robustness, attacks)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import lightning.pytorch as pl
from typing_extensions import override

from fl_lightning.algorithms.shared.algorithm import Algorithm, ClientContext, ClientUpdate
from fl_lightning.algorithms.fedavg import FedAvg
from fl_lightning.algorithms.shared.summable import SupportsWeightedSum
from fl_lightning.server.federated_parameters import FederatedParameters
from fl_lightning.server.federation import Federation
from fl_lightning.server.model_state import State

if TYPE_CHECKING:
    from fl_lightning.robust.update_bounds import UpdateBound


class AlgorithmWrapper(Algorithm):
    """Forwards every hook to :attr:`inner` (default :class:`FedAvg`); subclasses override what they change.

    The weighted-sum protocol (:class:`~fl_lightning.SupportsWeightedSum`) is forwarded too, so a
    wrapper of a summable algorithm that leaves aggregation alone still shards over processes.
    """

    def __init__(self, algorithm: Algorithm | None = None) -> None:
        self.inner = algorithm if algorithm is not None else FedAvg()
        refuse_over_dp(self)

    @override
    def setup(self, federation: Federation) -> None:
        super().setup(federation)
        self.inner.setup(federation)

    @override
    def select_clients(self, round_idx: int) -> list[int]:
        return self.inner.select_clients(round_idx)

    @override
    def overridden_settings(self) -> dict[str, str]:
        return self.inner.overridden_settings()

    @override
    def federated_parameters(self) -> FederatedParameters | None:
        return self.inner.federated_parameters()

    @override
    def plan_client(self, client: ClientContext) -> None:
        self.inner.plan_client(client)

    @override
    def configure_client(self, client: ClientContext, module: pl.LightningModule, global_state: State) -> None:
        self.inner.configure_client(client, module, global_state)

    @override
    def client_update(self, client: ClientContext, module: pl.LightningModule, delta: State) -> ClientUpdate:
        return self.inner.client_update(client, module, delta)

    @property  # type: ignore[misc]  # a class constant of Algorithm, the wrapped algorithm's here
    def asynchronous(self) -> bool:  # type: ignore[override]
        """Whether the wrapped algorithm runs on the asynchronous loop (which then reads its settings)."""
        return self.inner.asynchronous

    @property  # type: ignore[misc]  # a class constant of Algorithm, the wrapped algorithm's here
    def needs_fresh_optimizer(self) -> str:  # type: ignore[override]
        """The wrapped algorithm's reason to refuse ``reset_optimizer=False`` (it does the local work)."""
        return self.inner.needs_fresh_optimizer

    @property
    @override
    def uploads_deltas(self) -> bool:
        return self.inner.uploads_deltas

    @property
    @override
    def gathers_updates(self) -> bool:
        return self.inner.gathers_updates

    @property
    @override
    def secret_sample(self) -> bool:
        return self.inner.secret_sample

    @override
    def check_update_bound(self, bound: UpdateBound) -> None:
        self.inner.check_update_bound(bound)

    @property
    @override
    def aggregates_empty_rounds(self) -> bool:
        return self.inner.aggregates_empty_rounds

    @property
    @override
    def hides_client_statistics(self) -> bool:
        return self.inner.hides_client_statistics

    @override
    def privacy_statement(self) -> str | None:
        return self.inner.privacy_statement()

    @override
    def decode_update(self, update: ClientUpdate) -> ClientUpdate:
        return self.inner.decode_update(update)

    @override
    def replace_non_finite(self, update: ClientUpdate) -> ClientUpdate | None:
        return self.inner.replace_non_finite(update)

    @override
    def download_bytes(self, global_state: State) -> int:
        return self.inner.download_bytes(global_state)

    @override
    def aggregate(self, round_idx: int, global_state: State, updates: list[ClientUpdate]) -> dict[str, float]:
        return self.inner.aggregate(round_idx, global_state, updates)

    @property
    def summable(self) -> bool:
        """Whether the wrapped aggregation is a weighted sum (then clients shard over processes)."""
        return isinstance(self.inner, SupportsWeightedSum) and self.inner.summable

    def weighted_delta_sum(self, updates: list[ClientUpdate]) -> tuple[State, float]:
        assert isinstance(self.inner, SupportsWeightedSum)
        return self.inner.weighted_delta_sum(updates)

    def apply_weighted_sum(self, round_idx: int, global_state: State, total: State, weight: float) -> dict[str, float]:
        assert isinstance(self.inner, SupportsWeightedSum)
        return self.inner.apply_weighted_sum(round_idx, global_state, total, weight)

    def report_metrics(self, reports: list[ClientUpdate]) -> dict[str, float]:
        assert isinstance(self.inner, SupportsWeightedSum)
        return self.inner.report_metrics(reports)

    @override
    def evaluate(self, round_idx: int, module: pl.LightningModule) -> dict[str, float]:
        return self.inner.evaluate(round_idx, module)

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"inner": self.inner.state_dict()}

    @override
    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.inner.load_state_dict(state["inner"])

    @override
    def check_restored(self, rounds_done: int) -> None:
        self.inner.check_restored(rounds_done)


def wrapped(algorithm: Algorithm) -> Iterator[Algorithm]:
    """``algorithm`` and every algorithm it wraps, outermost first."""
    layer: Algorithm | None = algorithm
    while layer is not None:
        yield layer
        layer = layer.inner if isinstance(layer, AlgorithmWrapper) else None


def refuse_over_dp(wrapper: AlgorithmWrapper) -> None:
    """Raises ValueError, naming both, if ``wrapper`` reads unnoised client values
    (:meth:`~Algorithm.unnoised_client_values`) and wraps a DP mechanism: its noise would not cover them."""
    reads = wrapper.unnoised_client_values()
    mechanism = next((layer for layer in wrapped(wrapper.inner) if layer.differentially_private), None)
    if reads and mechanism is not None:
        outer, dp = type(wrapper).__name__, type(mechanism).__name__
        raise ValueError(
            f"{outer} and {dp} cannot be combined: {outer} reads {reads}, which {dp}'s noise does not cover and its "
            f"accountant does not count, so the reported epsilon would not bound what the run reveals."
        )
