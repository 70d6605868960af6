"""FedAvg over the shared tensors while every client keeps some layers of its own: the personal-layer
methods (FedBN, FedPer, LG-FedAvg) are selections of local tensors, not new loops."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from typing_extensions import override

from fl_lightning.algorithms.shared.personalized import OwnStateFedAvg
from fl_lightning.algorithms.shared.server_optimizers import ServerOptimizer
from fl_lightning.server.client_store import ClientStore
from fl_lightning.server.federated_parameters import FederatedParameters


class PersonalLayers(OwnStateFedAvg):
    """FedAvg whose clients keep the tensors ``local`` selects (:class:`~fl_lightning.FederatedParameters` patterns).

    The loop loads a client's own local tensors (the initial ones before its first round) after the global
    model, keeps them after it trains (:attr:`personal`, saved in every checkpoint) and never sends them:
    uploads, DP noise, codecs and robust rules cover the shared tensors only. The global model keeps the
    initial local tensors; :class:`~fl_lightning.FederatedEvaluation` scores each client with its own
    (``clients/personal/*``, :meth:`personalized_state`). Multi-process client sharding is refused (the
    personalised evaluation reads every client's tensors on each process). The batched executor loads each member's
    own local tensors into its row of the group and stores them back from it.

    Args:
        local: patterns of the layers each client keeps (a module name such as ``"head"``, a ``state_dict``
            glob, or a module class).
        server_optimizer, weighting: as in :class:`~fl_lightning.FedAvg`.
    """

    def __init__(
        self,
        *,
        local: Sequence[str],
        server_optimizer: ServerOptimizer | None = None,
        weighting: Literal["samples", "uniform"] = "samples",
    ) -> None:
        super().__init__(server_optimizer=server_optimizer, weighting=weighting)
        self._selection = FederatedParameters(local=local)
        if not local:
            raise ValueError(f"{type(self).__name__} needs at least one pattern in `local`, got {local!r}.")

    @override
    def federated_parameters(self) -> FederatedParameters:
        return self._selection

    @property  # type: ignore[override]
    def personal(self) -> ClientStore:
        """Client id -> its local tensors after its last round (the loop's store)."""
        assert self.federation.client_tensors is not None
        return self.federation.client_tensors.store

    @override
    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        if "personal" in state:  # written before the loop kept local tensors (fl_lightning < 0.3)
            self.load_client_store(self.personal, state["personal"], "personal")
