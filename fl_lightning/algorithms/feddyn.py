"""FedDyn (Acar et al., "Federated Learning Based on Dynamic Regularization", ICLR 2021): each client's
objective is corrected by a linear term so that its stationary points agree with the global one's."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, ClassVar

import lightning.pytorch as pl
import torch

from fl_lightning.algorithms.shared.algorithm import Algorithm, ClientContext, ClientUpdate
from fl_lightning.algorithms.shared.aggregation import apply_delta, weighted_sum
from fl_lightning.algorithms.shared.parameter_state import state_norm, zero_parameter_state
from fl_lightning.mixins.linear_term import LinearTermMixin
from fl_lightning.mixins.proximal import ProximalMixin
from fl_lightning.mixins.required import require_mixin
from fl_lightning.server.client_store import ClientStore, cpu_copy
from fl_lightning.server.federation import Federation
from fl_lightning.server.model_state import State

if TYPE_CHECKING:
    from fl_lightning.robust.update_bounds import UpdateBound


class FedDyn(Algorithm):
    r"""Federated dynamic regularisation (Acar et al. 2021, Algorithm 1).

    Each client :math:`k` keeps the gradient :math:`\nabla L_k(\theta_k^{t-1})` of its last local
    solution (in a :class:`~fl_lightning.server.client_store.ClientStore`; 0 before its first round); the
    server keeps :math:`h` (0 at the start). Round :math:`t`, with :math:`P_t` the active clients of :math:`m`:

    - local objective :math:`L_k(\theta) - \langle \nabla L_k(\theta_k^{t-1}), \theta \rangle
      + \frac{\alpha}{2}\lVert \theta - \theta^{t-1} \rVert^2`, through
      :class:`~fl_lightning.LinearTermMixin` and :class:`~fl_lightning.ProximalMixin` (:math:`\mu = \alpha`);
    - the first-order condition of that objective gives the new linear term,
      :math:`\nabla L_k(\theta_k^t) = \nabla L_k(\theta_k^{t-1}) - \alpha (\theta_k^t - \theta^{t-1})`;
    - :math:`h^t = h^{t-1} - \alpha \frac{1}{m} \sum_{k \in P_t} (\theta_k^t - \theta^{t-1})`;
    - :math:`\theta^t = \frac{1}{|P_t|} \sum_{k \in P_t} \theta_k^t - \frac{1}{\alpha} h^t`.

    The linear term and :math:`h` cover the shared parameters (``federated_parameters``: the trainable ones by default); buffers (BatchNorm statistics)
    take the plain mean of the active clients'. A client's new gradient term is stored when its
    update is aggregated: a dropped (non-finite) or rejected update leaves it unchanged, so
    :math:`h = \frac{1}{m} \sum_k \nabla L_k` stays true. The paper states the local problem as
    solved exactly; with a finite number of local steps the stored term is its first-order
    estimate above, as in the authors' code.

    Shards over processes by gathering the round's updates to every rank (:attr:`gathers_updates`): every
    rank updates :math:`h` from all of them, and each stores the gradient terms of the clients it owns (the
    client store's sharding: a client always trains on its owner rank).
    Not a weighted-sum aggregation, so DP and the robust rules refuse it; the trainer's ``update_bound`` is refused
    (it would change the delta the term is read from). The batched executor stacks each client's terms
    (``configure_client`` sets only the proximal and linear terms).

    Args:
        alpha: the regularisation coefficient :math:`\alpha > 0` (the paper: 0.01 to 0.1).
    """

    configure_client_sets_terms: ClassVar[bool] = True

    def __init__(self, *, alpha: float = 0.01) -> None:
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 < alpha < math.inf:
            raise ValueError(f"FedDyn's regularisation coefficient `alpha` must be a finite number > 0, got {alpha!r}.")
        self.alpha = float(alpha)
        #: The server state :math:`h` (trainable parameters only), on the CPU.
        self.h: State = {}
        #: Every client's :math:`\nabla L_k(\theta_k)`.
        self.gradients = ClientStore()

    def setup(self, federation: Federation) -> None:
        require_mixin(federation.module, LinearTermMixin, self)
        require_mixin(federation.module, ProximalMixin, self)
        super().setup(federation)
        if not self.h:
            self.h = zero_parameter_state(federation)

    def configure_client(self, client: ClientContext, module: pl.LightningModule, global_state: State) -> None:
        module.set_proximal_center(global_state, self.alpha)  # type: ignore[attr-defined]
        gradient = self.gradients.get(client.client_id)
        # A zero term in a client's first round adds an exact 0 to each gradient, and lets the executors see that it applies.
        direction = {n: torch.zeros_like(h) if gradient is None else -gradient[n] for n, h in self.h.items()}
        module.set_linear_term(direction)  # type: ignore[attr-defined]

    @property
    def gathers_updates(self) -> bool:
        """Yes: every rank needs every aggregated client's delta for :math:`h`."""
        return True

    @torch.no_grad()
    def aggregate(self, round_idx: int, global_state: State, updates: list[ClientUpdate]) -> dict[str, float]:
        """Stores each aggregated client's new gradient term, then updates :math:`h` and :math:`\\theta`."""
        for update in updates:
            if not self.gradients.owns(update.client_id):
                continue  # under client sharding, the rank that trains the client keeps its term
            delta = {name: update.payload[name].cpu() for name in self.h}
            previous = self.gradients.get(update.client_id)  # None: the client's first round, a zero term
            new = {n: -self.alpha * d if previous is None else previous[n] - self.alpha * d for n, d in delta.items()}
            self.gradients.put(update.client_id, new)
        total = weighted_sum([u.payload for u in updates], [1.0] * len(updates))
        for name, h in self.h.items():
            h.sub_(total[name].cpu(), alpha=self.alpha / self.federation.num_clients)
        # theta^t = mean_k theta_k^t - h^t / alpha, with mean_k theta_k^t = theta^{t-1} + (sum of deltas) / |P_t|.
        mean_delta = {name: t / len(updates) for name, t in total.items()}
        for name, h in self.h.items():
            mean_delta[name] = mean_delta[name] - h.to(mean_delta[name]) / self.alpha
        apply_delta(global_state, mean_delta)
        return {"h_norm": state_norm(self.h)}

    def check_update_bound(self, bound: UpdateBound) -> None:
        raise ValueError(
            f"update_bound={type(bound).__name__}(...) would change the deltas from which FedDyn reads each "
            "client's gradient term and h; remove the update bound for FedDyn."
        )

    def state_dict(self) -> dict[str, Any]:
        return {"h": dict(self.h), "gradients": self.gradients.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.h = cpu_copy(state["h"])
        self.load_client_store(self.gradients, state["gradients"], "gradients")
