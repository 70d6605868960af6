"""FedAvg (McMahan et al. 2017) with an optional server optimizer (Reddi et al. 2021)."""

from __future__ import annotations

from typing import Any, Literal

from fl_lightning.algorithms.shared.algorithm import ClientUpdate
from fl_lightning.algorithms.shared.server_optimizers import ServerOptimizer, ServerSGD
from fl_lightning.algorithms.shared.summable import SummableAggregation
from fl_lightning.server.model_state import State


class FedAvg(SummableAggregation):
    r"""Federated Averaging.

    The round's delta is :math:`\Delta_t = \sum_k n_k \Delta_k / \sum_k n_k` over the clients
    that reported (McMahan et al. 2017, Algorithm 1, with :math:`n_k` the client's number of
    samples; ``weighting="uniform"`` uses equal weights), and the server optimizer applies it
    (default: :math:`x_{t+1} = x_t + \Delta_t`).

    Args:
        server_optimizer: e.g. ``ServerSGD(momentum=0.9)`` for FedAvgM or ``ServerAdam()`` for FedAdam.
        weighting: ``"samples"`` (default) or ``"uniform"``.
    """

    def __init__(
        self,
        *,
        server_optimizer: ServerOptimizer | None = None,
        weighting: Literal["samples", "uniform"] = "samples",
    ) -> None:
        if weighting not in ("samples", "uniform"):
            raise ValueError(f"`weighting` must be 'samples' or 'uniform', got {weighting!r}.")
        self.server_optimizer = server_optimizer if server_optimizer is not None else ServerSGD()
        self.weighting = weighting

    def aggregation_weight(self, update: ClientUpdate) -> float:
        return float(update.num_samples) if self.weighting == "samples" else 1.0

    def unnoised_client_values(self) -> str:
        """With ``weighting="samples"``, each client's sample count; nothing with ``"uniform"``."""
        if self.weighting == "samples":
            return "each client's sample count to weight it (weighting='samples'; weighting='uniform' reads none)"
        return ""

    def apply_weighted_sum(self, round_idx: int, global_state: State, total: State, weight: float) -> dict[str, float]:
        if weight <= 0:
            raise ValueError(f"Aggregation weights must sum to a positive number, got {weight}.")
        delta = {name: t.div_(weight) for name, t in total.items()}
        self.server_optimizer.step(global_state, delta, self.federation.param_names)
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {"server_optimizer": self.server_optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.server_optimizer.load_state_dict(state["server_optimizer"])

    def check_restored(self, rounds_done: int) -> None:
        self.server_optimizer.check_restored(rounds_done)
