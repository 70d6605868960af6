"""q-FFL by q-FedAvg (Li et al. 2020, "Fair Resource Allocation in Federated Learning", ICLR):
fairness through the q-weighted objective :math:`\\sum_k p_k F_k^{q+1}(w) / (q+1)`."""

from __future__ import annotations

import math
from typing import ClassVar, Literal

import lightning.pytorch as pl
import torch

from fl_lightning.algorithms.shared.aggregation import apply_delta
from fl_lightning.algorithms.shared.algorithm import ClientContext, ClientUpdate
from fl_lightning.algorithms.shared.summable import SummableAggregation
from fl_lightning.evaluation.probe import probe
from fl_lightning.server.federation import Federation
from fl_lightning.server.model_state import State, tensor_bytes

#: ``ClientUpdate.metrics`` keys: :math:`F_k(w^t)` and :math:`L`, both read before local training, and :math:`h_k`.
START_LOSS, LIPSCHITZ, H = "qffl_start_loss", "qffl_lipschitz", "qffl_h"
#: Added to :math:`F_k` before powers, as the authors' code does (``loss + 1e-10``): a client with zero
#: loss would otherwise give :math:`h_k = 0` at :math:`q > 0` and :math:`0^{q-1}` at :math:`q < 1`.
LOSS_EPS = 1e-10


class QFedAvg(SummableAggregation):
    r"""q-FedAvg (Li et al. 2020, Algorithm 2), the solver of q-FFL: clients with a higher loss weigh more.

    Every round the server samples :math:`m` = ``clients_per_round`` clients, client :math:`k` chosen with
    probability :math:`p_k \propto n_k` (``sampling="samples"``, without replacement as in the authors'
    code; ``"uniform"`` for uniform sampling). Each computes :math:`F_k(w^t)`, its mean loss at the global
    model before training (one no-grad pass over its training data, :func:`~fl_lightning.evaluation.probe.probe`),
    trains as usual to :math:`\bar w_k^{t+1}`, and sends

    .. math:: \Delta w_k = L(w^t - \bar w_k^{t+1}), \quad \Delta_k = F_k^q(w^t)\,\Delta w_k, \quad
              h_k = q F_k^{q-1}(w^t) \lVert\Delta w_k\rVert^2 + L F_k^q(w^t);

    the server takes :math:`w^{t+1} = w^t - \sum_k \Delta_k / \sum_k h_k`. :math:`L` estimates the
    Lipschitz constant of the gradient; by default :math:`1/\eta` of the client optimizer's current
    learning rate (the paper's and the authors' choice). :math:`q = 0` is FedAvg with size-weighted
    sampling and a uniform mean of the deltas.

    As a weighted sum (:class:`~fl_lightning.SummableAggregation`) each client's payload is its own step
    :math:`-\Delta_k / h_k` with weight :math:`h_k`, so it shards over processes. The norm
    :math:`\lVert\Delta w_k\rVert` is over the parameters; buffers (BatchNorm statistics) take the same step
    (the paper's models have none; integer counters are averaged with weights :math:`h_k`).

    Needs no client state (no :class:`~fl_lightning.server.client_store.ClientStore`): :math:`F_k` is
    probed afresh each round. Its uploads are not deltas (scaled by :math:`F_k^q/h_k`), so ``DPFedAvg``
    and ``update_bound`` refuse it (a clip of the payload would not bound :math:`h_k`, sent in the
    clear); a robust aggregator replaces the :math:`h`-weighted mean by its statistic of the clients' steps.
    Under the batched executor each member's :meth:`configure_client` runs on the global weights before its group
    trains, so :math:`F_k(w^t)` and :math:`L` are read as the sequential executors read them.

    Headline metric: the worst-10 % client accuracy of :class:`~fl_lightning.FederatedEvaluation`
    (``clients/acc_worst10``).

    Args:
        q: fairness parameter :math:`q \ge 0`.
        lipschitz: :math:`L > 0`; ``None``: :math:`1/\eta` of the client optimizer.
        sampling: ``"samples"`` (the paper's :math:`p_k \propto n_k`) or ``"uniform"``.
    """

    summary_metrics: ClassVar[dict[str, str]] = {"clients/acc_worst10": "final"}
    #: Its configure_client only reads the module (F_k(w^t), L): it sets nothing the batched executor must stack.
    configure_client_sets_terms: ClassVar[bool] = True

    def __init__(
        self, *, q: float = 1.0, lipschitz: float | None = None, sampling: Literal["samples", "uniform"] = "samples"
    ) -> None:
        if isinstance(q, bool) or not isinstance(q, (int, float)) or not 0 <= q < math.inf:
            raise ValueError(f"`q` must be a finite number >= 0, got {q!r}.")
        if lipschitz is not None and (
            isinstance(lipschitz, bool) or not isinstance(lipschitz, (int, float)) or not 0 < lipschitz < math.inf
        ):
            raise ValueError(f"`lipschitz` must be None (1 / the client learning rate) or a finite number > 0, got {lipschitz!r}.")
        if sampling not in ("samples", "uniform"):
            raise ValueError(f"`sampling` must be 'samples' or 'uniform', got {sampling!r}.")
        self.q, self.lipschitz, self.sampling = float(q), lipschitz, sampling

    def setup(self, federation: Federation) -> None:
        super().setup(federation)
        if self.lipschitz is None:
            learning_rates = {float(g["lr"]) for o in federation.services.optimizers() for g in o.param_groups}
            if len(learning_rates) != 1:
                raise ValueError(
                    f"QFedAvg's default L = 1/lr needs one client learning rate, got {sorted(learning_rates)}: "
                    "pass `lipschitz`."
                )

    @property
    def uploads_deltas(self) -> bool:
        return False

    def select_clients(self, round_idx: int) -> list[int]:
        if self.sampling == "uniform":
            return super().select_clients(round_idx)
        fed = self.federation
        weights = torch.as_tensor(fed.num_samples, dtype=torch.float64)
        chosen = torch.multinomial(weights, fed.clients_per_round, replacement=False, generator=fed.generator("select", round_idx))
        return sorted(chosen.tolist())

    def lipschitz_constant(self, module: pl.LightningModule) -> float:
        """:math:`L`: ``lipschitz``, or :math:`1/\\eta` of the client optimizer now (a client's start)."""
        if self.lipschitz is not None:
            return float(self.lipschitz)
        return 1.0 / float(self.federation.services.optimizers()[0].param_groups[0]["lr"])

    def configure_client(self, client: ClientContext, module: pl.LightningModule, global_state: State) -> None:
        # The module holds the global weights now, before any local step: F_k(w^t) of Algorithm 2; and L from
        # the learning rate the client starts with (a per-step schedule has moved it by the end).
        client.metrics[START_LOSS] = probe(module, self.federation.probe_batches(client.client_id)).loss
        client.metrics[LIPSCHITZ] = self.lipschitz_constant(module)

    def client_update(self, client: ClientContext, module: pl.LightningModule, delta: State) -> ClientUpdate:
        lipschitz, loss = client.metrics[LIPSCHITZ], client.metrics[START_LOSS] + LOSS_EPS
        # delta = local - global, so Delta w_k = -L * delta.
        params = [t.double() for name, t in delta.items() if name in self.federation.param_names]
        norm_sq = lipschitz**2 * float(sum(t.square().sum() for t in params))
        h = self.q * loss ** (self.q - 1) * norm_sq + lipschitz * loss**self.q
        scale = lipschitz * loss**self.q / h
        payload = {name: t * scale if t.is_floating_point() else t for name, t in delta.items()}
        return ClientUpdate(
            client_id=client.client_id,
            num_samples=client.num_samples,
            num_steps=client.completed_steps,
            payload=payload,
            upload_bytes=tensor_bytes(payload) + 4,  # and h_k as one float32
            metrics={**client.metrics, H: h},
        )

    def aggregation_weight(self, update: ClientUpdate) -> float:
        return update.metrics[H]

    def apply_weighted_sum(self, round_idx: int, global_state: State, total: State, weight: float) -> dict[str, float]:
        if weight <= 0:
            raise ValueError(f"q-FedAvg's sum of h_k must be positive, got {weight}.")
        apply_delta(global_state, total, scale=1.0 / weight)
        return {}
