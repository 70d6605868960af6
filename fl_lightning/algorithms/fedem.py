"""FedEM (Marfoq et al., "Federated Multi-Task Learning under a Mixture of Distributions",
NeurIPS 2021): the EM baseline of FedSoft."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import lightning.pytorch as pl
import torch
from torch import Tensor
from typing_extensions import override

from fl_lightning.algorithms.shared.aggregation import apply_delta, weighted_average
from fl_lightning.algorithms.shared.algorithm import ClientContext, ClientUpdate
from fl_lightning.algorithms.shared.clustered_algorithm import ClusteredAlgorithm
from fl_lightning.server.federation import Federation
from fl_lightning.mixins.required import require_mixin
from fl_lightning.mixins.mixture_weighted import MixtureWeightedMixin, responsibilities
from fl_lightning.server.model_state import State, compute_delta
from fl_lightning.evaluation.probe import WeightSets


class FedEM(ClusteredAlgorithm):
    r"""Federated EM over :math:`M` shared components (Marfoq et al. 2021, Alg. 1).

    The server holds :math:`M` components :math:`\theta_m` (the clustered centres, on the CPU);
    every client :math:`t` has mixture weights :math:`\pi_t` (``[N, M]`` CPU tensor, uniform
    at the start). Each round, every selected client (``clients_per_round``, drawn uniformly):

    1. **E-step** with the round's components and its previous :math:`\pi_t`:
       :math:`q_t(z_i = m) \propto \pi_{tm} \exp(-\ell(h_{\theta_m}(x_i), y_i))`
       (:func:`~fl_lightning.mixins.mixture_weighted.responsibilities`; one batched probe
       of the :math:`M` components over its training data).
    2. **M-step** for the weights: :math:`\pi_{tm} = \frac{1}{n_t}\sum_i q_t(z_i = m)`.
    3. **M-step** for the components: from :math:`\theta_m`, for every :math:`m` one after the
       other, the local epochs/steps on :math:`\frac{1}{B}\sum_{i \in B} q_t(z_i = m)\,\ell`
       (:class:`~fl_lightning.MixtureWeightedMixin`). Each component is one run of the
       trainer's client executor with the same batch order and a fresh optimizer, so hooks,
       callbacks and precision apply; the client uploads the :math:`M` deltas.
    4. **Aggregation**: :math:`\theta_m \leftarrow \theta_m + \sum_t \frac{n_t}{\sum_s n_s}\Delta_{t,m}`
       (the paper's sample-weighted average), over the clients of the round.

    The new :math:`\pi_t` is committed at aggregation, so a round re-run after a resume starts
    from the same state. Memory: the :math:`M` components on the server (and, during a round,
    on the device), :math:`\pi` on the CPU: :math:`O(M \times \text{model} + N M)`. With
    ``M = 1``, :math:`q \equiv 1` and FedEM is FedAvg. A client's personalised model for the
    metrics is its component of largest :math:`\pi_{tm}` (FedSoft's protocol for its baselines);
    the :math:`\pi_t`-mixture of predictive distributions is not evaluated. The loop's global
    model is component 0 (see :class:`ClusteredAlgorithm`). Not supported with
    ``client_executor="batched"`` or multi-process sharding.

    Round metrics: ``fedem_pi_mean_c{m}``, ``fedem_pi_entropy`` (mean over clients of
    :math:`-\sum_m \pi_{tm}\log\pi_{tm}`), plus :meth:`ClusteredAlgorithm.evaluate`'s.

    Args:
        num_components: :math:`M \ge 1` (``num_clusters`` of the clustered base).
        centres, batched_probe, personal_eval_every, probe_batch_size, evaluate_sources: see
            :class:`ClusteredAlgorithm`.
    """

    batched_refusal: ClassVar[str] = (
        "each client trains its M components one after another (Alg. 1's M-step, components 1..M-1 from client_update), "
        "each on a loss that MixtureWeightedMixin weights per sample by responsibilities computed from all M components' "
        "losses on every batch, which the batched step does not stack per client."
    )

    def __init__(
        self,
        *,
        num_components: int = 2,
        centres: Sequence[Mapping[str, Tensor]] | None = None,
        batched_probe: bool = True,
        personal_eval_every: int = 1,
        probe_batch_size: int = 512,
        evaluate_sources: bool = False,
    ) -> None:
        if isinstance(num_components, bool) or not isinstance(num_components, int) or num_components < 1:
            raise ValueError(f"The number of components M (`num_components`) must be an int >= 1, got {num_components!r}.")
        super().__init__(
            num_clusters=num_components,
            centres=centres,
            batched_probe=batched_probe,
            personal_eval_every=personal_eval_every,
            probe_batch_size=probe_batch_size,
            evaluate_sources=evaluate_sources,
        )
        self.pi = torch.empty(0, num_components, dtype=torch.float64)
        self._component = 0
        self._pending_pi: dict[int, Tensor] = {}
        self._deltas: list[State] = []

    @override
    def setup(self, federation: Federation) -> None:
        require_mixin(federation.module, MixtureWeightedMixin, self)
        super().setup(federation)
        self.pi = torch.full((federation.num_clients, self.num_clusters), 1.0 / self.num_clusters, dtype=torch.float64)
        self._pending_pi, self._component = {}, 0

    @override
    def configure_client(self, client: ClientContext, module: pl.LightningModule, global_state: State) -> None:
        cid, m = client.client_id, self._component
        log_pi = self.pi[cid].log()
        if m == 0:  # E-step and pi's M-step once per client and round, before any component moves
            q = responsibilities(self.centre_losses(cid).double(), log_pi)
            self._pending_pi[cid] = q.mean(dim=0).cpu()
            self._deltas = []
        self.federation.load_local_weights(self.centres_on_device()[m])
        if self._probe_weights is None:
            self._probe_weights = WeightSets(module, self.centres_on_device())
        module.set_mixture_component(self._probe_weights, log_pi, m)  # type: ignore[attr-defined]

    @override
    def client_update(self, client: ClientContext, module: pl.LightningModule, delta: State) -> ClientUpdate:
        """Trains components ``1..M-1`` after the loop trained component 0; uploads the ``M`` deltas."""
        self._deltas.append(compute_delta(self.federation.local_weights(), self.centres_on_device()[self._component]))
        if self._component > 0:  # an inner run, driven from component 0's call below
            return super().client_update(client, module, {})
        steps, metrics = client.completed_steps, [client.metrics]
        try:
            for m in range(1, self.num_clusters):
                self._component = m
                inner = self.federation.services.train_client(client.round_idx, client.client_id, seed=client.seed)
                steps += inner.num_steps
                metrics.append(inner.metrics)
        finally:
            self._component = 0
            module.set_mixture_component(None)  # type: ignore[attr-defined]
        payload = {f"{m}/{k}": v for m, d in enumerate(self._deltas) for k, v in d.items()}
        update = super().client_update(client, module, payload)
        update.num_steps = steps
        update.metrics = {k: sum(d[k] for d in metrics) / len(metrics) for k in metrics[0] if all(k in d for d in metrics)}
        return update

    @override
    def aggregate(self, round_idx: int, global_state: State, updates: list[ClientUpdate]) -> dict[str, float]:
        centres = [{k: v.clone() for k, v in c.items()} for c in self.centres_on_device()]
        weights = [float(u.num_samples) for u in updates]
        for m, centre in enumerate(centres):
            deltas = [{k: u.payload[f"{m}/{k}"] for k in centre} for u in updates]
            apply_delta(centre, weighted_average(deltas, weights))
        self.set_centres(centres, global_state)
        for u in updates:  # a dropped (non-finite) client keeps its previous pi
            self.pi[u.client_id] = self._pending_pi[u.client_id]
        self._pending_pi = {}
        entropy = -(self.pi * self.pi.clamp_min(1e-300).log()).sum(dim=1).mean()
        return {
            "fedem_pi_entropy": float(entropy),
            **{f"fedem_pi_mean_c{m}": float(self.pi[:, m].mean()) for m in range(self.num_clusters)},
        }

    # --- evaluation and state ------------------------------------------------------------

    @override
    def estimated_importance(self) -> Tensor | None:
        return self.pi

    @override
    def personal_models(self) -> dict[int, Mapping[str, Tensor]]:
        """Each client's component of largest :math:`\\pi_{tm}` (ties to the lowest index)."""
        centres = self.centres_on_device()
        return {cid: centres[m] for cid, m in enumerate(self.pi.argmax(dim=1).tolist())}

    @override
    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "pi": self.pi.clone()}

    @override
    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.pi = state["pi"].cpu().clone()
