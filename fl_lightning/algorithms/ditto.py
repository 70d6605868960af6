"""Ditto (Li, Hu, Beirami & Smith, "Ditto: Fair and Robust Federated Learning Through Personalization",
ICML 2021): a personalised model per client, pulled towards the global one."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import lightning.pytorch as pl
from typing_extensions import override

from fl_lightning.algorithms.shared.algorithm import ClientContext, ClientUpdate
from fl_lightning.algorithms.shared.personalized import PersonalizedFedAvg
from fl_lightning.algorithms.shared.server_optimizers import ServerOptimizer
from fl_lightning.mixins.proximal import ProximalMixin
from fl_lightning.mixins.required import require_mixin
from fl_lightning.server.client_store import cpu_copy
from fl_lightning.server.federation import Federation
from fl_lightning.server.model_state import State


class Ditto(PersonalizedFedAvg):
    r"""Ditto (Li et al. 2021, Algorithm 1) with FedAvg as the global solver.

    Every selected client :math:`k` of round :math:`t`, from the global :math:`w^t`:

    1. **Global update** (line 5): FedAvg's local work on :math:`F_k` from :math:`w^t`, giving
       :math:`\Delta_k^t = w_k^t - w^t`, the client's upload.
    2. **Personal update** (lines 6-8): from its own :math:`v_k` (the initial global model :math:`w^0`
       before its first round, as the authors' code initialises it), local steps on
       :math:`h_k(v; w^t) = F_k(v) + \frac{\lambda}{2}\lVert v - w^t\rVert^2` (eq. 2), i.e.
       :math:`v_k \leftarrow v_k - \eta(\nabla F_k(v_k) + \lambda(v_k - w^t))`, through
       :class:`~fl_lightning.ProximalMixin` centred on :math:`w^t` (not on :math:`w_k^t`: the paper's
       :math:`h_k` is centred on the global model the client received). It is a second run of the trainer's
       client executor (``Federation.services.train_client_later``: its update is not read), so hooks,
       callbacks, precision and the lean executor apply; the optimizer starts fresh (``reset_optimizer``),
       on the same batch order as step 1 (the paper does not fix one). The new :math:`v_k` stays on the
       client: it is stored in :attr:`personal` and never uploaded.
    3. **Aggregation** (line 10): FedAvg's, :math:`w^{t+1} = w^t + \sum_k n_k \Delta_k^t / \sum_k n_k`
       (or the server optimizer's step on it).

    The local work of step 2 is ``personal_steps`` optimizer steps (the paper's :math:`s`), or, by default,
    the trainer's ``local_epochs``/``local_steps`` as for step 1. :math:`\lambda = 0` trains purely local
    models; :math:`\lambda \to \infty` pulls :math:`v_k` onto :math:`w^t`. The round's ``train_loss`` and
    ``num_steps`` are step 1's; :math:`v_k` is evaluated through
    :class:`~fl_lightning.FederatedEvaluation` (``clients/personal/*``), the paper's headline (mean and
    worst-client accuracy of the personalised models).

    Shards: no (the store is per process; see :class:`PersonalizedFedAvg`). Under the batched executor step 1
    trains the round's clients in groups, and the personal passes of a group's clients then train as one group of
    their own (each :math:`v_k` loaded by :meth:`configure_client` into its row, the proximal term stacked as
    FedProx's), before those clients end; the sequential executors run each client's pass right after its step 1.
    Composes with ``DPFedAvg`` (the released global
    model is clipped and noised; :math:`v_k` is never released, but is trained on the client's data
    without noise) and with the robust rules over its global aggregation, as the paper's robustness
    experiments do.

    Args:
        lam: :math:`\lambda \ge 0` (the paper tunes it per data set from a small grid; it decides how personal :math:`v_k` is).
        personal_steps: :math:`s \ge 1` optimizer steps of the personal update, or ``None``: the trainer's
            local work.
        server_optimizer, weighting: as in :class:`~fl_lightning.FedAvg`.
    """

    needs_fresh_optimizer: ClassVar[str] = "Ditto's personal pass (Algorithm 1, step 2) starts a fresh optimizer on v_k"
    configure_client_sets_terms: ClassVar[bool] = True
    configure_client_loads_weights: ClassVar[bool] = True

    def __init__(
        self,
        *,
        lam: float = 0.1,
        personal_steps: int | None = None,
        server_optimizer: ServerOptimizer | None = None,
        weighting: Literal["samples", "uniform"] = "samples",
    ) -> None:
        if isinstance(lam, bool) or not isinstance(lam, (int, float)) or not 0 <= lam < float("inf"):
            raise ValueError(f"Ditto's `lam` (lambda) must be a finite number >= 0, got {lam!r}.")
        if personal_steps is not None and (
            isinstance(personal_steps, bool) or not isinstance(personal_steps, int) or personal_steps < 1
        ):
            raise ValueError(f"Ditto's `personal_steps` (s) must be an int >= 1 or None, got {personal_steps!r}.")
        super().__init__(server_optimizer=server_optimizer, weighting=weighting)
        self.lam, self.personal_steps = float(lam), personal_steps
        #: :math:`v_k^0`, every client's personal model before its first round.
        self.initial: State = {}
        #: The clients whose next training is their personal pass (step 2), asked for by their step 1.
        self._personal_pass: set[int] = set()

    @override
    def setup(self, federation: Federation) -> None:
        require_mixin(federation.module, ProximalMixin, self)
        super().setup(federation)
        self.initial = cpu_copy(federation.local_weights())
        self._personal_pass = set()

    @override
    def plan_client(self, client: ClientContext) -> None:
        if client.client_id in self._personal_pass and self.personal_steps is not None:
            client.num_epochs, client.num_steps = None, self.personal_steps

    @override
    def configure_client(self, client: ClientContext, module: pl.LightningModule, global_state: State) -> None:
        if client.client_id not in self._personal_pass:  # step 1: FedAvg's local work, no term left from a personal pass
            module.set_proximal_center(global_state, 0.0)  # type: ignore[attr-defined]
            return
        own = self.personal.get(client.client_id)
        self.federation.load_local_weights(self.initial if own is None else own)
        module.set_proximal_center(global_state, self.lam)  # type: ignore[attr-defined]

    @override
    def client_update(self, client: ClientContext, module: pl.LightningModule, delta: State) -> ClientUpdate:
        """Step 1's delta is the upload; it asks for step 2, whose own call here keeps :math:`v_k` in the store."""
        if client.client_id in self._personal_pass:
            self._personal_pass.discard(client.client_id)
            self.personal.put(client.client_id, self.federation.local_weights())
            return super().client_update(client, module, {})
        update = super().client_update(client, module, delta)
        self._personal_pass.add(client.client_id)
        self.federation.services.train_client_later(client.round_idx, client.client_id, seed=client.seed)
        return update

    @override
    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "initial": dict(self.initial)}

    @override
    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.initial = {k: v.cpu() for k, v in state["initial"].items()}
