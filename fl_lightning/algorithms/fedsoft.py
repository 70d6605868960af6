"""FedSoft (Ruan & Joe-Wong, "FedSoft: Soft Clustered Federated Learning with Proximal Local
Updating", AAAI 2022): soft clustering with proximal local updates toward several centres."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import lightning.pytorch as pl
import torch
from torch import Tensor

from fl_lightning.utils.saved_state import InvalidStateError, check_client_id, check_tensor
from fl_lightning.algorithms.shared.algorithm import ClientContext, ClientUpdate
from fl_lightning.algorithms.shared.clustered_algorithm import ClusteredAlgorithm
from fl_lightning.algorithms.shared.combinable import Combine
from fl_lightning.algorithms.shared.optimizer_state import flatten_optimizer_states, unflatten_optimizer_states
from fl_lightning.algorithms.shared.cluster_math import (
    aggregation_weights,
    as_model,
    average_states,
    importance_weights,
    select_per_cluster,
)
from fl_lightning.server.federation import Federation
from fl_lightning.mixins.proximal import ProximalMixin
from fl_lightning.mixins.required import require_mixin
from fl_lightning.server.client_store import ClientStore, cpu_copy
from fl_lightning.server.model_state import State, tensor_bytes
from fl_lightning.utils.checks import non_negative


class FedSoft(ClusteredAlgorithm):
    r"""Soft clustered FL (Ruan & Joe-Wong 2022, Algorithm 1).

    Every client's data is a mixture of :math:`S` source distributions with unknown proportions
    :math:`u_{ks}`. The server keeps :math:`S` centres :math:`c_s` and every client keeps its own
    personalised model :math:`w_k`. Round :math:`t`:

    1. **Importance** (every :math:`\tau` rounds, over all :math:`N` clients): each client scores
       its samples with every centre (one ``vmap``-ed pass over the :math:`S` centres,
       :func:`~fl_lightning.evaluation.probe.sample_metrics_many`), assigns each sample to the centre with
       the lowest loss and sends :math:`u_{ks} = \max(n_{ks}/n_k, \sigma)`, not renormalised
       (:func:`~fl_lightning.algorithms.shared.cluster_math.importance_weights`).
    2. **Selection**: :math:`v_{sk} = u_{ks} n_k / \sum_{j=1}^N u_{js} n_j` (eq. 6 normalised over
       *all* clients, as the proof and the authors' code; the printed sum over
       :math:`Sel_s^t` is a typo); per cluster, :math:`K` clients drawn :math:`\propto v_{sk}`,
       without replacement by default (the authors' code; ``replace=True`` follows the analysis).
       The union trains, each client once even when several clusters picked it.
    3. **Local update** from the client's own :math:`w_k` (the common initial model before its
       first round): :math:`\min_w f_k(w) + \frac{\lambda}{2}\sum_s u_{ks}\lVert w - c_s^t\rVert^2`
       (eq. 4) through :meth:`~fl_lightning.ProximalMixin.set_proximal_centers`; the result is
       the new :math:`w_k`, uploaded whole.
    4. **Aggregation** (line 18): :math:`c_s^{t+1} = \frac{1}{|Sel_s|}\sum_{k \in Sel_s} w_k^{t+1}`,
       a uniform average over the clients drawn for :math:`s` (a client drawn twice with
       ``replace=True`` counts twice; a dropped, non-finite client is left out). Buffers are
       averaged too (integer counters rounded), as the authors average full ``state_dict``\ s.

    State: the centres, :math:`u` (``[N, S]``) and the common initial model are CPU tensors; every
    client's :math:`w_k` is in the client store :attr:`models` and, with ``persist_optimizer_state``,
    its optimizer state (as the authors carry Adam's moments across rounds) in :attr:`optimizer_states`
    (:class:`~fl_lightning.server.client_store.ClientStore`: in host memory up to the trainer's
    ``client_state_memory``, spilled to disk beyond it). Only the :math:`S` centres of the round and the
    training client's model are on the device, so accelerator memory does not grow with :math:`N`. All
    of it is in :meth:`state_dict`; a checkpoint written before the store (``clients.models``,
    ``clients.optimizers``) is converted on load.

    The loop's global model is centre 0 (see :class:`ClusteredAlgorithm`); ``clients_per_round``
    is not used (``K`` per cluster is). Round metrics: ``distinct_clients``, ``estimated``
    (1 in importance rounds), ``importance_download_bytes`` (the :math:`S` centres sent to all
    :math:`N` clients for estimation; ``round/download_bytes`` counts the :math:`S` centres sent
    to each training client), ``u_mean_c{s}``, ``client_state_mib``, and from :meth:`evaluate` the per-source
    centre matrix ``src{d}_c{s}_loss/acc``, ``u_error`` (mean :math:`|\hat u - u|` after the
    best relabelling, when the data carries ``source_ids``) and ``personal_{train,heldout}_*``.

    Args:
        num_clusters: :math:`S \ge 1`.
        clients_per_cluster: :math:`K`, at most the number of clients (paper: 60 of 100).
        lam: :math:`\lambda \ge 0` (paper: 1 synthetic, 0.1 EMNIST, 0.01 CIFAR-10).
        tau: importance re-estimation interval :math:`\tau \ge 1` (paper: 2).
        sigma: floor :math:`\sigma \in (0, 1/S]` (paper: 1e-4).
        replace: sample :math:`Sel_s` with replacement.
        persist_optimizer_state: keep each client's optimizer state across its rounds (the
            authors' Adam); otherwise the trainer's ``reset_optimizer`` applies.
        centres, batched_probe, personal_eval_every, probe_batch_size, evaluate_sources: see
            :class:`ClusteredAlgorithm`.
    """

    # Sets each client's proximal term (its own coefficient lambda * U_k and constant, stacked per client by the batched
    # executor) after loading its own w_k; the optimizer states it loads with persist_optimizer_state are refused below.
    configure_client_sets_terms: ClassVar[bool] = True
    configure_client_loads_weights: ClassVar[bool] = True

    @property
    def batched_refusal(self) -> str:  # type: ignore[override]
        """Why the batched executor cannot train these clients: only with ``persist_optimizer_state``."""
        if not self.persist_optimizer_state:
            return ""
        return (
            "persist_optimizer_state carries each client's optimizer state between its rounds, while the batched "
            "executor starts every client from a fresh one (reset_optimizer=True)."
        )

    def __init__(
        self,
        *,
        num_clusters: int = 2,
        clients_per_cluster: int = 60,
        lam: float = 1.0,
        tau: int = 2,
        sigma: float = 1e-4,
        replace: bool = False,
        persist_optimizer_state: bool = False,
        centres: Sequence[Mapping[str, Tensor]] | None = None,
        batched_probe: bool = True,
        personal_eval_every: int = 1,
        probe_batch_size: int = 512,
        evaluate_sources: bool = False,
    ) -> None:
        super().__init__(
            num_clusters=num_clusters,
            centres=centres,
            batched_probe=batched_probe,
            personal_eval_every=personal_eval_every,
            probe_batch_size=probe_batch_size,
            evaluate_sources=evaluate_sources,
        )
        if isinstance(tau, bool) or not isinstance(tau, int) or tau < 1:
            raise ValueError(f"The importance re-estimation interval `tau` must be an int >= 1, got {tau!r}.")
        if not 0 < sigma <= 1 / num_clusters:
            raise ValueError(
                f"`sigma` must be in (0, 1/S] = (0, {1 / num_clusters:.6g}] for S={num_clusters}, got {sigma!r}."
            )
        non_negative("lam", lam)  # the proximal coefficient lambda
        if isinstance(clients_per_cluster, bool) or not isinstance(clients_per_cluster, int) or clients_per_cluster < 1:
            raise ValueError(f"`clients_per_cluster` (K) must be an int >= 1, got {clients_per_cluster!r}.")
        self.clients_per_cluster = clients_per_cluster
        self.lam, self.tau, self.sigma = float(lam), tau, float(sigma)
        self.replace, self.persist_optimizer_state = replace, persist_optimizer_state
        self.u = torch.empty(0, num_clusters, dtype=torch.float64)
        self.initial: State = {}
        #: Each client's personalised model :math:`w_k` (every ``state_dict`` tensor).
        self.models = ClientStore()
        #: Each client's optimizer states (``persist_optimizer_state``), flattened (:func:`flatten_optimizer_states`).
        self.optimizer_states = ClientStore()
        #: :math:`Sel_s` of every round (``S`` lists per round).
        self.selection_history: list[list[list[int]]] = []
        self._pending_optimizer: dict[int, State] = {}

    def setup(self, federation: Federation) -> None:
        require_mixin(federation.module, ProximalMixin, self)
        if self.clients_per_cluster > federation.num_clients:
            raise ValueError(
                f"FedSoft selects K={self.clients_per_cluster} clients per cluster but there are only "
                f"{federation.num_clients} clients: set `clients_per_cluster` <= {federation.num_clients}."
            )
        super().setup(federation)
        self.initial = cpu_copy(self.federation.local_weights())  # every client's model before its first round
        self.u = torch.full((federation.num_clients, self.num_clusters), 1.0 / self.num_clusters, dtype=torch.float64)
        self._pending_optimizer = {}

    # --- round ---------------------------------------------------------------------------

    def estimate_importance(self) -> Tensor:
        """Re-estimates :math:`u` (``[N, S]``) for every client with the current centres."""
        rows = [importance_weights(self.centre_losses(cid), self.sigma) for cid in range(self.federation.num_clients)]
        self.u = torch.stack(rows).cpu()
        return self.u

    def select_clients(self, round_idx: int) -> list[int]:
        estimated = round_idx % self.tau == 0
        if estimated:
            self.estimate_importance()
        v = aggregation_weights(self.u, self.federation.num_samples)
        generator = self.federation.generator("select", round_idx)
        selected = select_per_cluster(v, self.clients_per_cluster, generator, replace=self.replace)
        del self.selection_history[round_idx:]
        self.selection_history.append(selected)
        clients = sorted({c for sel in selected for c in sel})
        broadcast = self.federation.num_clients * self.num_clusters * tensor_bytes(self.centres[0]) if estimated else 0
        self.federation.services.report_round_metrics({
            "distinct_clients": float(len(clients)),
            "estimated": float(estimated),
            "importance_download_bytes": float(broadcast),
            **{f"u_mean_c{s}": float(self.u[:, s].mean()) for s in range(self.num_clusters)},
        })
        return clients

    def configure_client(self, client: ClientContext, module: pl.LightningModule, global_state: State) -> None:
        cid = client.client_id
        own = self.models.get(cid)
        self.federation.load_local_weights(self.initial if own is None else own)
        module.set_proximal_centers(self.centres_on_device(), self.u[cid], self.lam)  # type: ignore[attr-defined]
        if self.persist_optimizer_state:
            saved = self.optimizer_states.get(cid)
            self.federation.services.load_optimizer_states(None if saved is None else unflatten_optimizer_states(saved))

    @property
    def uploads_deltas(self) -> bool:
        """No: a client uploads its whole model, so no update bound applies."""
        return False

    def client_update(self, client: ClientContext, module: pl.LightningModule, delta: State) -> ClientUpdate:
        """The client uploads its whole new model :math:`w_k^{t+1}` (kept on the CPU)."""
        model = cpu_copy(self.federation.local_weights())
        if self.persist_optimizer_state:
            self._pending_optimizer[client.client_id] = flatten_optimizer_states(self.federation.services.optimizer_states())
        return super().client_update(client, module, model)  # uploads the local model, not a delta

    def aggregate(self, round_idx: int, global_state: State, updates: list[ClientUpdate]) -> dict[str, float]:
        return self.aggregate_with(round_idx, global_state, updates, average_states)

    @property
    def combinable(self) -> bool:
        """Yes: each centre's members form a group (:class:`~fl_lightning.algorithms.shared.combinable.SupportsCombine`)."""
        return True

    def combine_group(self) -> tuple[str, int]:
        """:math:`K`, the clients drawn per cluster."""
        return "clients_per_cluster", self.clients_per_cluster

    def aggregate_with(self, round_idx: int, global_state: State, updates: list[ClientUpdate], combine: Combine) -> dict[str, float]:
        """Line 18 with ``combine`` of each centre's members' models in place of their uniform average
        (:func:`average_states`), integer buffers rounded; a centre none of whose clients reported keeps its value."""
        models = {u.client_id: u.payload for u in updates}
        for cid, model in models.items():
            self.models.put(cid, model)
            if cid in self._pending_optimizer:
                self.optimizer_states.put(cid, self._pending_optimizer[cid])
        self._pending_optimizer = {}
        centres = []
        for s, sel in enumerate(self.selection_history[round_idx]):
            members = [models[c] for c in sel if c in models]
            centres.append(as_model(combine(members), members[0]) if members else self.centres[s])
        self.set_centres(centres, global_state)
        return {"client_state_mib": (self.models.nbytes() + self.optimizer_states.nbytes()) / 2**20}

    # --- evaluation and state ------------------------------------------------------------

    def estimated_importance(self) -> Tensor | None:
        return self.u

    def personal_models(self) -> dict[int, Mapping[str, Tensor]]:
        """The personalised models of the clients that have trained at least once."""
        return dict(self.models.items())

    def personalized_state(self, client_id: int) -> Mapping[str, Tensor] | None:
        """Client ``client_id``'s personalised model :math:`w_k` (``None`` before its first round), for federated evaluation."""
        return self.models.get(client_id)

    def state_dict(self) -> dict[str, Any]:
        return {
            **super().state_dict(),
            "u": self.u.clone(),
            "initial": dict(self.initial),
            "models": self.models.state_dict(),
            "optimizer_states": self.optimizer_states.state_dict(),
            "selection_history": [[list(s) for s in r] for r in self.selection_history],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        # Before set-up (a state loaded by hand) the number of clients is not known yet: the saved one stands.
        clients = self.federation.num_clients if hasattr(self, "federation") else getattr(state["u"], "shape", (0,))[0]
        self.u = check_tensor("u", state["u"], shape=(clients, self.num_clusters), low=self.sigma, high=1.0).cpu().clone()
        self.initial = {k: v.cpu() for k, v in state["initial"].items()}
        saved = {name: state[name] for name in ("models", "optimizer_states") if name in state}
        if "clients" in state:  # written before the client store: {"models": {cid: model}, "optimizers": {cid: [states]}}
            old = state["clients"]
            saved = {
                "models": {"entries": old["models"]},
                "optimizer_states": {"entries": {c: flatten_optimizer_states(s) for c, s in old["optimizers"].items()}},
            }
        for name, store in {"models": self.models, "optimizer_states": self.optimizer_states}.items():
            self.load_client_store(store, saved[name], name)
        self.selection_history = [[list(s) for s in r] for r in state["selection_history"]]
        for r, selected in enumerate(self.selection_history):
            if len(selected) != self.num_clusters:
                raise InvalidStateError(f"`selection_history[{r}]` must hold one selection per cluster ({self.num_clusters}), got {len(selected)}.")
            for cid in (c for cluster in selected for c in cluster):
                check_client_id(f"selection_history[{r}]", cid, clients)
