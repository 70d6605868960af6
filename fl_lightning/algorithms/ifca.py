"""IFCA (Ghosh et al., "An Efficient Framework for Clustered Federated Learning", NeurIPS 2020):
hard clustering, the baseline of FedSoft."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import ClassVar

import lightning.pytorch as pl
import torch
from torch import Tensor

from fl_lightning.algorithms.shared.aggregation import apply_delta, weighted_average
from fl_lightning.algorithms.shared.algorithm import ClientContext, ClientUpdate
from fl_lightning.algorithms.shared.clustered_algorithm import ClusteredAlgorithm
from fl_lightning.server.federation import Federation
from fl_lightning.server.model_state import State, compute_delta


class IFCA(ClusteredAlgorithm):
    r"""Iterative Federated Clustering (Ghosh et al. 2020, Algorithm 2, model averaging).

    Each round, ``clients_per_round`` clients are drawn uniformly (the base selection). Each
    scores the :math:`S` centres on its training data (one batched probe) and picks
    :math:`\hat j_k = \arg\min_j \frac{1}{n_k}\sum_i \ell(c_j; x_i, y_i)` (ties to the lowest
    index); it trains from :math:`c_{\hat j_k}` (plain local training, no proximal term) and
    sends :math:`\Delta_k = w_k - c_{\hat j_k}`. Each centre moves by the mean delta of the
    clients that picked it, :math:`c_j \leftarrow c_j + \frac{1}{|M_j|}\sum_{k \in M_j}\Delta_k`
    (uniform, as IFCA's :math:`\sum_k s_{k,j}\tilde\theta_k / \sum_k s_{k,j}`; ``weighting="samples"``
    weights by :math:`n_k`); a centre nobody picked is unchanged.

    As in FedSoft's comparison, a client's personalised model is its centre: the one with the
    lowest loss on its training data at evaluation time, and its importance estimate is the
    hard one-hot of that choice (``u_error`` against the true mixture, computed with the
    personalised metrics since it probes every client). The loop's global model
    is centre 0 (see :class:`ClusteredAlgorithm`).

    Args:
        num_clusters: :math:`S \ge 1`.
        weighting: ``"uniform"`` (default) or ``"samples"``.
        centres, batched_probe, personal_eval_every, probe_batch_size, evaluate_sources: see
            :class:`ClusteredAlgorithm`.
    """

    importance_is_state = False
    #: Its configure_client loads the client's centre :math:`c_{\hat j_k}` (the batched executor copies it into the
    #: client's row) and unsets a proximal term; the centres are scored at selection, before any client trains.
    configure_client_sets_terms: ClassVar[bool] = True
    configure_client_loads_weights: ClassVar[bool] = True

    def __init__(
        self,
        *,
        num_clusters: int = 2,
        weighting: str = "uniform",
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
        if weighting not in ("uniform", "samples"):
            raise ValueError(f"`weighting` must be 'uniform' or 'samples', got {weighting!r}.")
        self.weighting = weighting
        #: Cluster picked by each client of the current round.
        self.assignment: dict[int, int] = {}
        self._hard: Tensor | None = None

    def setup(self, federation: Federation) -> None:
        super().setup(federation)
        self.assignment, self._hard = {}, None

    def choose(self, cid: int) -> int:
        """The centre with the lowest mean loss on client ``cid``'s training data."""
        return int(self.centre_losses(cid).mean(dim=0).argmin())

    def select_clients(self, round_idx: int) -> list[int]:
        clients = super().select_clients(round_idx)
        self.assignment = {cid: self.choose(cid) for cid in clients}
        return clients

    def configure_client(self, client: ClientContext, module: pl.LightningModule, global_state: State) -> None:
        self.federation.load_local_weights(self.centres_on_device()[self.assignment[client.client_id]])
        if hasattr(module, "set_proximal_center"):
            module.set_proximal_center(global_state, 0.0)  # no proximal term, whatever ran before

    def client_update(self, client: ClientContext, module: pl.LightningModule, delta: State) -> ClientUpdate:
        centre = self.centres_on_device()[self.assignment[client.client_id]]
        return super().client_update(client, module, compute_delta(self.federation.local_weights(), centre))  # from its own centre

    def aggregate(self, round_idx: int, global_state: State, updates: list[ClientUpdate]) -> dict[str, float]:
        centres = [{k: v.clone() for k, v in c.items()} for c in self.centres_on_device()]
        members = [0] * self.num_clusters
        for j in range(self.num_clusters):
            mine = [u for u in updates if self.assignment[u.client_id] == j]
            members[j] = len(mine)
            if mine:
                weights = [float(u.num_samples) if self.weighting == "samples" else 1.0 for u in mine]
                apply_delta(centres[j], weighted_average([u.payload for u in mine], weights))
        self.set_centres(centres, global_state)
        self._hard = None
        return {f"members_c{j}": float(m) for j, m in enumerate(members)}

    # --- evaluation ----------------------------------------------------------------------

    def _choices(self) -> Tensor:
        if self._hard is None:
            self._hard = torch.tensor([self.choose(c) for c in range(self.federation.num_clients)])
        return self._hard

    def estimated_importance(self) -> Tensor | None:
        return torch.nn.functional.one_hot(self._choices(), self.num_clusters).to(torch.float64)

    def personal_models(self) -> dict[int, Mapping[str, Tensor]]:
        centres = self.centres_on_device()
        return {cid: centres[j] for cid, j in enumerate(self._choices().tolist())}

    def personalized_state(self, client_id: int) -> Mapping[str, Tensor]:
        """Client ``client_id``'s cluster centre (lowest loss on its training data), for federated
        evaluation; clients of one cluster share the mapping, so it is scored once for all of them."""
        choice = self.choose(client_id) if self._hard is None else int(self._hard[client_id])
        return self.centres_on_device()[choice]
