"""The locally-trained-model baseline: each client trains a model of its own on its own data only.

FedALIGN's App. C.1 ("Performance of FedALIGN vs models trained locally at non-priority clients")
compares the federated model with such models on the clients' own test data; the two report the
same metric, :func:`holdout_metrics`, so their curves are comparable round by round.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import lightning.pytorch as pl
import torch
from typing_extensions import override

from fl_lightning.evaluation.protocols import has_client_holdout
from fl_lightning.algorithms.shared.algorithm import Algorithm, ClientContext, ClientUpdate
from fl_lightning.server.client_store import ClientStore, cpu_copy
from fl_lightning.server.federation import Federation
from fl_lightning.server.model_state import State, live_tensors, load_into, snapshot
from fl_lightning.evaluation.probe import sample_metrics


def check_client_ids(name: str, clients: Sequence[int], num_clients: int) -> list[int]:
    """``clients`` sorted and de-duplicated; a ``ValueError`` naming ``name`` if empty or out of range."""
    ids = sorted({int(c) for c in clients})
    if not ids:
        raise ValueError(f"`{name}` is empty: give at least one client id.")
    bad = [c for c in ids if not 0 <= c < num_clients]
    if bad:
        raise ValueError(f"`{name}` ids {bad} are out of range: ids are 0..{num_clients - 1}.")
    return ids


def holdout_metrics(module: pl.LightningModule, data: Any, models: dict[int, State | None]) -> dict[str, float]:
    """Accuracy and loss on the clients' held-out samples, pooled over their samples.

    Client ``c`` is scored by ``models[c]`` (loaded into ``module`` for the pass), or by the
    module as it is when ``models[c]`` is ``None``; the module's weights are restored afterwards.
    Needs per-client held-out data (:func:`~fl_lightning.evaluation.protocols.has_client_holdout`). Returns ``local_test_acc`` (when the module
    reports ``correct``) and ``local_test_loss``.
    """
    if not has_client_holdout(data):
        raise ValueError("Evaluating on the clients' own test data needs per-client held-out data: FederatedDataModule(..., holdout_fraction > 0) or a natural federation's test split.")
    live = live_tensors(module)
    current = snapshot(live)
    parts: dict[str, list[torch.Tensor]] = {}
    try:
        for cid, model in models.items():
            if model is not None:
                load_into({name: live[name] for name in model}, model)
            for key, value in sample_metrics(module, data.holdout_dataloader(cid)).items():
                parts.setdefault(key, []).append(value)
    finally:
        load_into(live, current)
    names = {"correct": "local_test_acc", "loss": "local_test_loss"}
    return {names[key]: float(torch.cat(values).mean()) for key, values in parts.items() if key in names}


class LocalOnly(Algorithm):
    """Baseline: every client in ``clients`` trains its own model on its own data, with no averaging.

    Each round every such client resumes from its own model (the initial global model the first
    time) and runs the usual local work (``local_epochs`` / ``local_steps``), so after round
    :math:`t` its model has seen :math:`t` rounds of local training: the local model of FedALIGN's
    App. C.1, on the same round axis as the federated run. The global model never changes and
    nothing is uploaded or downloaded (0 bytes). Round metrics: ``local_test_acc`` and
    ``local_test_loss`` of each client's own model on its own held-out samples, pooled over
    samples (:func:`holdout_metrics`); pass the same ``evaluate_clients`` to
    :class:`~fl_lightning.FedALIGN` to score the federated model on the same data.

    Local models live in a client store (:class:`~fl_lightning.server.client_store.ClientStore`: host
    memory up to the trainer's ``client_state_memory``, disk beyond it); the baseline is meant for the
    paper's 60 clients, in one process. A checkpoint written before the store is converted on load.

    Args:
        clients: ids of the clients that train local models; ``None`` means every client.
    """

    summary_metrics: ClassVar[dict[str, str]] = {"round/local_test_acc": "final"}
    #: Its configure_client only loads the client's own model (the batched executor copies it into the client's row).
    configure_client_sets_terms: ClassVar[bool] = True
    configure_client_loads_weights: ClassVar[bool] = True

    def __init__(self, *, clients: Sequence[int] | None = None) -> None:
        if clients is not None and (isinstance(clients, (str, bytes)) or not isinstance(clients, Sequence)):
            raise TypeError(f"`clients` must be a sequence of client ids or None, got {clients!r}.")
        self.clients_spec = None if clients is None else list(clients)
        #: Each client's own model (every ``state_dict`` tensor).
        self.models = ClientStore()

    @override
    def setup(self, federation: Federation) -> None:
        super().setup(federation)
        every = range(federation.num_clients)
        self.clients = check_client_ids("clients", self.clients_spec if self.clients_spec is not None else every, federation.num_clients)

    @override
    def select_clients(self, round_idx: int) -> list[int]:
        return list(self.clients)

    @override
    def download_bytes(self, global_state: State) -> int:
        return 0

    @override
    def configure_client(self, client: ClientContext, module: pl.LightningModule, global_state: State) -> None:
        own = self.models.get(client.client_id)
        if own is not None:
            self.federation.load_local_weights(own)

    @override
    def client_update(self, client: ClientContext, module: pl.LightningModule, delta: State) -> ClientUpdate:
        """Hands the client's new local model to :meth:`aggregate`, which keeps it (nothing on the wire)."""
        update = super().client_update(client, module, cpu_copy(self.federation.local_weights()))
        update.upload_bytes = 0
        return update

    @override
    def aggregate(self, round_idx: int, global_state: State, updates: list[ClientUpdate]) -> dict[str, float]:
        for update in updates:
            self.models.put(update.client_id, update.payload)
        return {}

    @override
    def evaluate(self, round_idx: int, module: pl.LightningModule) -> dict[str, float]:
        models: dict[int, State | None] = {cid: self.models.get(cid) for cid in self.clients if cid in self.models}
        return holdout_metrics(module, self.federation.data, models) if models else {}

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"models": self.models.state_dict()}

    @override
    def load_state_dict(self, state: dict[str, Any]) -> None:
        models = state["models"]
        if "entries" not in models:  # written before the client store: {cid: model}
            models = {"entries": models}
        self.load_client_store(self.models, models, "models")
