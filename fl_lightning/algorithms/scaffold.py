"""SCAFFOLD (Karimireddy et al., "SCAFFOLD: Stochastic Controlled Averaging for Federated Learning",
ICML 2020): local steps corrected by control variates, which remove the client drift of FedAvg."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities.rank_zero import rank_zero_warn

from fl_lightning.algorithms.shared.algorithm import ClientContext, ClientUpdate
from fl_lightning.algorithms.shared.parameter_state import state_norm, zero_parameter_state
from fl_lightning.algorithms.shared.server_optimizers import ServerSGD
from fl_lightning.algorithms.shared.summable import SummableAggregation, aggregate_weighted_sum
from fl_lightning.mixins.linear_term import LinearTermMixin, check_linear_term_applied
from fl_lightning.mixins.required import require_mixin
from fl_lightning.server.client_store import ClientStore, cpu_copy
from fl_lightning.server.federation import Federation
from fl_lightning.server.model_state import State
from fl_lightning.server.services import ServerServices

if TYPE_CHECKING:
    from fl_lightning.robust.update_bounds import UpdateBound

#: Prefix of the control-variate update :math:`\Delta c_i` in a client's payload, next to :math:`\Delta y_i`.
CONTROL = "scaffold.delta_c/"


class SCAFFOLD(SummableAggregation):
    r"""SCAFFOLD with control variates option II (Karimireddy et al. 2020, Algorithm 1).

    The server keeps the model :math:`x` and the control variate :math:`c`; each client keeps
    :math:`c_i` (in a :class:`~fl_lightning.server.client_store.ClientStore`; :math:`c_i = 0` until its
    first round, as :math:`c = 0` at the start). Round :math:`t`, with :math:`S` the sampled clients:

    - line 10, each of the :math:`K` local steps:
      :math:`y_i \leftarrow y_i - \eta_l (g_i(y_i) - c_i + c)`, through the linear term
      :math:`\langle y, c - c_i \rangle` of :class:`~fl_lightning.LinearTermMixin`;
    - line 12, option II: :math:`c_i^+ = c_i - c + \frac{1}{K \eta_l}(x - y_i)`;
    - line 13, upload :math:`(\Delta y_i, \Delta c_i) = (y_i - x, c_i^+ - c_i)`: twice the model's bytes;
    - lines 16-17: :math:`x \leftarrow x + \frac{\eta_g}{|S|} \sum_{i \in S} \Delta y_i` and
      :math:`c \leftarrow c + \frac{1}{N} \sum_{i \in S} \Delta c_i`.

    :math:`K` is the client's number of optimizer steps (it may differ between clients) and
    :math:`\eta_l` the learning rate of the module's optimizer when the client finishes: option II
    reads :math:`(x - y_i)/(K \eta_l)` as the mean corrected gradient, which holds for plain SGD
    (other optimizers warn). Control variates cover the trainable parameters; buffers (BatchNorm
    statistics) take the plain mean :math:`\frac{1}{|S|}\sum \Delta y_i`, without :math:`\eta_g`.
    A client's :math:`c_i^+` is stored when its update is aggregated: a dropped (non-finite) or
    rejected update leaves :math:`c_i` unchanged, so :math:`c = \frac{1}{N}\sum_i c_i` stays true.

    Does not shard over processes: the server stores each aggregated client's :math:`c_i^+` from its
    payload, which under client sharding it sees only summed. For the same reason (and because
    :math:`\Delta c_i` reveals :math:`\Delta y_i`), DP and robust wrappers and the trainer's
    ``update_bound`` are refused; the batched executor refuses it (per-client ``configure_client``).

    Args:
        global_lr: the server step size :math:`\eta_g > 0` (the paper's experiments: 1).
    """

    def __init__(self, *, global_lr: float = 1.0) -> None:
        if isinstance(global_lr, bool) or not isinstance(global_lr, (int, float)) or not 0 < global_lr < math.inf:
            raise ValueError(f"SCAFFOLD's server step size `global_lr` (eta_g) must be a finite number > 0, got {global_lr!r}.")
        self.global_lr = float(global_lr)
        self._server_step = ServerSGD(lr=self.global_lr)
        #: The server control variate :math:`c` (trainable parameters only), on the CPU.
        self.control: State = {}
        #: Every client's :math:`c_i`.
        self.client_controls = ClientStore()

    def setup(self, federation: Federation) -> None:
        require_mixin(federation.module, LinearTermMixin, self)
        super().setup(federation)
        _check_local_steps(federation.services)
        if not self.control:
            self.control = zero_parameter_state(federation)

    def _client_control(self, client_id: int) -> State:
        stored = self.client_controls.get(client_id)
        return stored if stored is not None else {name: torch.zeros_like(c) for name, c in self.control.items()}

    def configure_client(self, client: ClientContext, module: pl.LightningModule, global_state: State) -> None:
        c_i = self._client_control(client.client_id)
        module.set_linear_term({name: c - c_i[name] for name, c in self.control.items()})  # type: ignore[attr-defined]

    def client_update(self, client: ClientContext, module: pl.LightningModule, delta: State) -> ClientUpdate:
        steps, lr = client.completed_steps, _local_lr(self.federation.services)
        check_linear_term_applied(module, steps, self)
        delta_c = {}
        for name, c in self.control.items():
            dy = delta[name]
            # Option II; a client that took no step keeps its c_i (the quotient is undefined).
            delta_c[CONTROL + name] = -c.to(dy) - dy / (steps * lr) if steps else torch.zeros_like(dy)
        return super().client_update(client, module, {**delta, **delta_c})

    def aggregation_weight(self, update: ClientUpdate) -> float:
        return 1.0  # lines 16-17 average uniformly over S

    def aggregate(self, round_idx: int, global_state: State, updates: list[ClientUpdate]) -> dict[str, float]:
        """Stores each aggregated client's :math:`c_i^+ = c_i + \\Delta c_i`, then the server step of the weighted sum."""
        for update in updates:
            c_i = self._client_control(update.client_id)
            self.client_controls.put(update.client_id, {n: c + update.payload[CONTROL + n].cpu() for n, c in c_i.items()})
        return aggregate_weighted_sum(self, round_idx, global_state, updates)

    def apply_weighted_sum(self, round_idx: int, global_state: State, total: State, weight: float) -> dict[str, float]:
        mean_dy = {name: total[name] / weight for name in global_state}
        self._server_step.step(global_state, mean_dy, self.federation.param_names)
        num_clients = self.federation.num_clients
        for name, c in self.control.items():
            c.add_(total[CONTROL + name].cpu(), alpha=1.0 / num_clients)
        return {"control_norm": state_norm(self.control)}

    def check_update_bound(self, bound: UpdateBound) -> None:
        raise ValueError(
            f"update_bound={type(bound).__name__}(...) would bound SCAFFOLD's upload (Delta y_i, Delta c_i) as one "
            "vector and scale the control variates with it; remove the update bound for SCAFFOLD."
        )

    def state_dict(self) -> dict[str, Any]:
        return {"control": dict(self.control), "client_controls": self.client_controls.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.control = cpu_copy(state["control"])
        self.client_controls.load_state_dict(state["client_controls"])
        self.check_client_ids(self.client_controls.ids(), "client_controls")


def _check_local_steps(services: ServerServices) -> None:
    """Raises unless the trainer has one optimizer; warns once where option II's :math:`(x - y_i)/(K \\eta_l)`
    is not the mean corrected gradient: a local optimizer other than plain SGD, or a learning rate that a
    step-interval scheduler moves within a round (option II then uses the rate when the client finishes)."""
    optimizers = services.optimizers()
    if len(optimizers) != 1:
        raise ValueError(f"SCAFFOLD needs exactly one optimizer (its step size is eta_l), got {len(optimizers)}.")
    optimizer = optimizers[0]
    if not isinstance(optimizer, torch.optim.SGD) or any(group.get("momentum", 0) for group in optimizer.param_groups):
        rank_zero_warn(
            f"SCAFFOLD's control variates (option II) assume plain SGD local steps; the module's optimizer is "
            f"{type(optimizer).__name__}{' with momentum' if isinstance(optimizer, torch.optim.SGD) else ''}, "
            "so (x - y_i) / (K lr) is not the mean corrected gradient."
        )
    if "step" in services.lr_scheduler_intervals():
        rank_zero_warn(
            "SCAFFOLD's control variates (option II) divide by K * lr, but an interval='step' LR scheduler changes lr "
            "within a round: the lr when each client finishes is used."
        )


def _local_lr(services: ServerServices) -> float:
    """:math:`\\eta_l`: the learning rate of the module's optimizer (the same in every parameter group)."""
    rates = {float(group["lr"]) for group in services.optimizers()[0].param_groups}
    if len(rates) != 1:
        raise ValueError(f"SCAFFOLD needs one local learning rate eta_l; the optimizer's parameter groups have {sorted(rates)}.")
    return rates.pop()
