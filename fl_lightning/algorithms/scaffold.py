"""SCAFFOLD (Karimireddy et al., "SCAFFOLD: Stochastic Controlled Averaging for Federated Learning",
ICML 2020): local steps corrected by control variates, which remove the client drift of FedAvg."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING, Any, ClassVar

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from typing_extensions import override

from fl_lightning.utils.saved_state import InvalidStateError
from fl_lightning.algorithms.shared.aggregation import RunningSum
from fl_lightning.algorithms.shared.algorithm import Algorithm, ClientContext, ClientUpdate
from fl_lightning.algorithms.shared.folding import RoundFold, fold_all
from fl_lightning.algorithms.shared.parameter_state import state_norm, zero_parameter_state
from fl_lightning.algorithms.shared.server_optimizers import ServerSGD
from fl_lightning.mixins.linear_term import LinearTermMixin
from fl_lightning.mixins.required import require_mixin
from fl_lightning.server.client_store import ClientStore, cpu_copy
from fl_lightning.server.federation import Federation
from fl_lightning.server.model_state import State, tensor_bytes
from fl_lightning.server.services import ServerServices

if TYPE_CHECKING:
    from fl_lightning.robust.update_bounds import UpdateBound


class SCAFFOLD(Algorithm):
    r"""SCAFFOLD with control variates option II (Karimireddy et al. 2020, Algorithm 1).

    The server keeps the model :math:`x` and the control variate :math:`c`; each client keeps
    :math:`c_i` (in a :class:`~fl_lightning.server.client_store.ClientStore`; :math:`c_i = 0` until its
    first round, as :math:`c = 0` at the start). Round :math:`t`, with :math:`S` the sampled clients:

    - line 6, the server sends :math:`(x, c)`, counted in ``download_bytes`` (the model plus its trainable parameters);
    - line 10, each of the :math:`K` local steps:
      :math:`y_i \leftarrow y_i - \eta_l (g_i(y_i) - c_i + c)`, through the linear term
      :math:`\langle y, c - c_i \rangle` of :class:`~fl_lightning.LinearTermMixin`;
    - line 12, option II: :math:`c_i^+ = c_i - c + \frac{1}{K \eta_l}(x - y_i)`;
    - line 13, upload :math:`(\Delta y_i, \Delta c_i) = (y_i - x, c_i^+ - c_i)`, counted in ``upload_bytes``
      (the model plus its trainable parameters); :math:`\Delta c_i = -c - \Delta y_i / (K \eta_l)` is a function
      of :math:`\Delta y_i` and of what the server knows, so the simulation carries :math:`\Delta y_i` alone and
      the server computes :math:`\Delta c_i` exactly as the client would;
    - lines 16-17: :math:`x \leftarrow x + \frac{\eta_g}{|S|} \sum_{i \in S} \Delta y_i` and
      :math:`c \leftarrow c + \frac{1}{N} \sum_{i \in S} \Delta c_i`.

    :math:`K` is the client's number of optimizer steps (it may differ between clients) and
    :math:`\eta_l` the learning rate of the module's optimizer at aggregation (the round's): option II
    reads :math:`(x - y_i)/(K \eta_l)` as the mean corrected gradient, which holds for plain SGD
    (other optimizers warn). Control variates cover the shared parameters (``federated_parameters``: the trainable ones by default, a frozen base never); buffers (BatchNorm
    statistics) take the plain mean :math:`\frac{1}{|S|}\sum \Delta y_i`, without :math:`\eta_g`.
    A client's :math:`c_i^+` is stored when its update is aggregated: a dropped (non-finite) or
    rejected update leaves :math:`c_i` unchanged, so :math:`c = \frac{1}{N}\sum_i c_i` stays true.

    On one process the round is streamed (:meth:`start_fold`): each client's :math:`c_i^+` is stored and its
    :math:`\Delta y_i`, :math:`\Delta c_i` added to running sums as the client finishes, so the round holds one update;
    :meth:`aggregate` is the same fold over a list, so both give the same bits.
    Shards over processes by gathering the round's updates to every rank (:attr:`gathers_updates`): every
    rank computes :math:`c` from all of them, and each stores the :math:`c_i^+` of the clients it owns (the
    client store's sharding: a client always trains on its owner rank). Not
    a weighted-sum aggregation, so DP and the robust rules refuse it; the trainer's ``update_bound`` is refused (the
    client's :math:`c_i^+` comes from its own, unbounded :math:`y_i`). The batched executor stacks each client's
    :math:`c - c_i` (``configure_client`` sets only the linear term).

    Args:
        global_lr: the server step size :math:`\eta_g > 0` (the paper's experiments: 1).
    """

    configure_client_sets_terms: ClassVar[bool] = True
    needs_fresh_optimizer: ClassVar[str] = "SCAFFOLD's option II, c_i+ = c_i - c + (x - y_i)/(K lr), reads the displacement of the client's own K steps"

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

    def download_bytes(self, global_state: State) -> int:
        """Line 6 sends each sampled client the server's :math:`(x, c)`: the model and the control variate."""
        return super().download_bytes(global_state) + tensor_bytes(self.control)

    def client_update(self, client: ClientContext, module: pl.LightningModule, delta: State) -> ClientUpdate:
        update = super().client_update(client, module, delta)
        # Line 13 sends Delta c_i too: one more tensor per trainable parameter.
        return replace(update, upload_bytes=update.upload_bytes + tensor_bytes({n: delta[n] for n in self.control}))

    @property
    def gathers_updates(self) -> bool:
        r"""Yes: every rank needs every aggregated client's :math:`\Delta c_i` for :math:`c`."""
        return True

    @override
    def start_fold(self, round_idx: int, global_state: State) -> RoundFold | None:
        r"""Lines 16-17 are sums over :math:`S`, folded one client at a time, except under an ``interval="step"`` LR
        scheduler, whose :math:`\eta_l` at aggregation is known only once the round's last client has trained."""
        return None if "step" in self.federation.services.lr_scheduler_intervals() else _ScaffoldFold(self, global_state)

    def aggregate(self, round_idx: int, global_state: State, updates: list[ClientUpdate]) -> dict[str, float]:
        """Lines 12 and 17 for the aggregated clients (each :math:`c_i^+` stored) and line 16."""
        return fold_all(_ScaffoldFold(self, global_state), updates)

    def check_update_bound(self, bound: UpdateBound) -> None:
        raise ValueError(
            f"update_bound={type(bound).__name__}(...) would bound SCAFFOLD's Delta y_i on the server, but each client "
            "computes its c_i from its own unbounded y_i; remove the update bound for SCAFFOLD."
        )

    def state_dict(self) -> dict[str, Any]:
        return {"control": dict(self.control), "client_controls": self.client_controls.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.control = cpu_copy(state["control"])
        self.load_client_store(self.client_controls, state["client_controls"], "client_controls")

    def check_restored(self, rounds_done: int) -> None:
        r"""Algorithm 1 keeps :math:`c = \frac1N \sum_i c_i` (lines 12 and 17: :math:`c` moves by :math:`\frac1N` of
        every :math:`\Delta c_i`), so a control variate off that mean by more than round-off (:data:`_CONTROL_RTOL` of the
        tensor's largest :math:`\frac1N\sum_i |c_i| + |c|`, in float64) was edited. The scale is the tensor's, not the
        coordinate's: a coordinate whose controls all but cancel (a dead ReLU unit's weights) keeps the float32 round-off of
        the rounds it was larger in. Under client sharding, where each process holds a share of the :math:`c_i`, the sums
        are added over the processes (one all-reduce)."""
        n, sizes = self.federation.num_clients, [c.numel() for c in self.control.values()]
        sums = torch.zeros(2, sum(sizes), dtype=torch.float64)  # sum_i c_i and sum_i |c_i|, flat
        for _, c_i in self.client_controls.items():
            flat = torch.cat([c_i[name].double().reshape(-1) for name in self.control])
            sums[0].add_(flat)
            sums[1].add_(flat.abs())
        total, magnitude = self.client_controls.sum_over_ranks(sums)
        c = torch.cat([c.double().reshape(-1) for c in self.control.values()])
        gap, scale = (c - total / n).abs(), magnitude / n + c.abs()
        for name, name_gap, name_scale in zip(self.control, gap.split(sizes), scale.split(sizes)):
            if bool((name_gap > _CONTROL_RTOL * name_scale.max()).any()):
                raise InvalidStateError(
                    f"`control.{name}` is not the mean of the clients' `client_controls` (Algorithm 1 keeps c = (1/N) sum_i c_i): "
                    f"off by up to {float(name_gap.max()):.4g}."
                )


#: The round-off :meth:`SCAFFOLD.check_restored` allows between :math:`c` and the mean of the :math:`c_i`, relative to
#: the tensor's scale.
_CONTROL_RTOL = 1e-3


class _ScaffoldFold(RoundFold):
    r"""Lines 12-17 one client at a time: each :math:`c_i^+` stored and :math:`\Delta c_i` and :math:`\Delta y_i` added to
    running sums as the client comes (:math:`\eta_l` read once, when the fold starts); :meth:`finish` steps
    :math:`x` and :math:`c`."""

    def __init__(self, scaffold: SCAFFOLD, global_state: State) -> None:
        self.scaffold, self.global_state = scaffold, global_state
        self.lr = _local_lr(scaffold.federation.services)
        self.sum_delta_c = {name: torch.zeros_like(c) for name, c in scaffold.control.items()}
        self.sum_delta_y = RunningSum()

    @override
    @torch.no_grad()
    def add(self, update: ClientUpdate) -> None:
        scaffold, steps = self.scaffold, update.num_steps
        if steps:  # option II's quotient is undefined without a step: such a client keeps its c_i
            delta_c = {name: -c - update.payload[name].cpu() / (steps * self.lr) for name, c in scaffold.control.items()}
            if scaffold.client_controls.owns(update.client_id):  # under client sharding, the rank that trains it
                c_i = scaffold._client_control(update.client_id)
                scaffold.client_controls.put(update.client_id, {name: c_i[name] + d for name, d in delta_c.items()})
            for name, d in delta_c.items():
                self.sum_delta_c[name].add_(d)
        self.sum_delta_y.add(update.payload, 1.0)  # uniform over S

    @override
    @torch.no_grad()
    def finish(self) -> dict[str, float]:
        scaffold, running = self.scaffold, self.sum_delta_y
        if not running.count:
            raise ValueError("Cannot aggregate an empty list of deltas.")
        mean_delta_y = {name: t.div_(running.weight) for name, t in running.total.items()}
        scaffold._server_step.step(self.global_state, mean_delta_y, scaffold.federation.param_names)
        for name, c in scaffold.control.items():
            c.add_(self.sum_delta_c[name], alpha=1.0 / scaffold.federation.num_clients)
        return {"control_norm": state_norm(scaffold.control)}


def _check_local_steps(services: ServerServices) -> None:
    """Raises unless the trainer has one optimizer; warns once where option II's :math:`(x - y_i)/(K \\eta_l)`
    is not the mean corrected gradient: a local optimizer other than plain SGD, or a learning rate that a
    step-interval scheduler moves within a round (option II then uses the rate at aggregation)."""
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
            "within a round: the lr at aggregation is used."
        )


def _local_lr(services: ServerServices) -> float:
    """:math:`\\eta_l`: the learning rate of the module's optimizer (the same in every parameter group)."""
    rates = {float(group["lr"]) for group in services.optimizers()[0].param_groups}
    if len(rates) != 1:
        raise ValueError(f"SCAFFOLD needs one local learning rate eta_l; the optimizer's parameter groups have {sorted(rates)}.")
    return rates.pop()
