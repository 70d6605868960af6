"""FedAvg whose clients also keep a model, or part of one, of their own: Ditto's :math:`v_k`, FedBN's norm layers."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import torch.distributed as dist
from torch import Tensor
from typing_extensions import override

from fl_lightning.algorithms.fedavg import FedAvg
from fl_lightning.algorithms.shared.algorithm import Algorithm, ClientUpdate
from fl_lightning.algorithms.shared.server_optimizers import ServerOptimizer
from fl_lightning.server.client_store import ClientStore
from fl_lightning.server.federation import Federation


def refuse_client_sharding(algorithm: Algorithm) -> None:
    """Raises ``ValueError`` under client sharding: ``algorithm``'s personalised evaluation reads every client's
    own state on each process, but each process keeps only the clients it trains."""
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        raise ValueError(
            f"{type(algorithm).__name__}'s personalised evaluation reads every client's own state on each process, "
            f"but under client sharding over {dist.get_world_size()} processes each keeps only the clients it "
            "trains: run it with devices=1."
        )


class OwnStateFedAvg(FedAvg):
    """FedAvg whose clients keep state of their own in :attr:`personal`, scored by federated evaluation.

    :meth:`personalized_state` hands a client's entry to :class:`~fl_lightning.FederatedEvaluation`, whose
    ``clients/personal/*`` metrics score each client's own model on its held-out data. Multi-process client
    sharding is refused in :meth:`setup` (:func:`refuse_client_sharding`). Subclasses say where the store is.
    """

    #: Client id -> that client's own tensors (by ``state_dict`` name), on the CPU.
    personal: ClientStore

    @override
    def setup(self, federation: Federation) -> None:
        refuse_client_sharding(self)
        super().setup(federation)

    def personalized_state(self, client_id: int) -> Mapping[str, Tensor] | None:
        """Client ``client_id``'s own tensors (``None`` before its first round), for federated evaluation."""
        return self.personal.get(client_id)

    @override
    def report_metrics(self, reports: list[ClientUpdate]) -> dict[str, float]:
        return {**super().report_metrics(reports), "client_state_mib": self.personal.nbytes() / 2**20}


class PersonalizedFedAvg(OwnStateFedAvg):
    """FedAvg's global model plus per-client state in :attr:`personal` (a :class:`ClientStore`).

    The client-side hooks write a client's entry when it trains; :meth:`personalized_state` hands it to
    :class:`~fl_lightning.FederatedEvaluation`, whose ``clients/personal/*`` metrics then score each
    client's own model on its held-out data. The store is saved in :meth:`state_dict`.

    The global aggregation stays FedAvg's weighted sum (so DP and robust wrappers compose). Multi-process
    client sharding is refused in :meth:`setup`: the store would keep each client on the rank that trains it,
    but the personalised evaluation (:meth:`personalized_state`) reads every client's entry on each process.
    """

    def __init__(
        self,
        *,
        server_optimizer: ServerOptimizer | None = None,
        weighting: Literal["samples", "uniform"] = "samples",
    ) -> None:
        super().__init__(server_optimizer=server_optimizer, weighting=weighting)
        self.personal = ClientStore()

    @override
    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "personal": self.personal.state_dict()}

    @override
    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.load_client_store(self.personal, state["personal"], "personal")
