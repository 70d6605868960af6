"""What federated evaluation asks of the data and the algorithm: held-out data per client,
each client's own model, and named groups of clients. All structural: implement the method."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from torch import Tensor


@runtime_checkable
class SupportsHoldout(Protocol):
    """Data with a local held-out split per client (:class:`~fl_lightning.data.FederatedDataModule`
    with ``holdout_fraction > 0``)."""

    def holdout_dataloader(self, cid: int) -> Iterable[Any]: ...


def has_client_holdout(data: object) -> bool:
    """Whether ``data`` holds out samples on each client: a :class:`SupportsHoldout` that does not say
    ``holdout_fraction == 0`` (a natural federation's per-client test split has no such fraction)."""
    return isinstance(data, SupportsHoldout) and getattr(data, "holdout_fraction", None) != 0


@runtime_checkable
class SupportsPersonalizedState(Protocol):
    """An algorithm whose clients have their own model (FedSoft's personalised weights, IFCA's cluster centre).

    ``personalized_state(client_id)`` returns that model's ``state_dict`` tensors (missing names
    keep the module's own), or ``None`` when the client has none yet. Clients sharing a model
    should get the same mapping object: it is then scored once on all their data.
    """

    def personalized_state(self, client_id: int) -> Mapping[str, Tensor] | None: ...


@runtime_checkable
class SupportsClientGroups(Protocol):
    """An algorithm or data module that defines named groups of clients, e.g. FedALIGN's
    ``{"priority": [...], "nonpriority": [...]}``. Groups may overlap and need not cover every client."""

    def client_groups(self) -> Mapping[str, Sequence[int]]: ...
