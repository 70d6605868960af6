"""FedNova (Wang et al. 2020, "Tackling the Objective Inconsistency Problem in Heterogeneous Federated
Optimization", NeurIPS): normalised averaging of clients that ran different numbers of local steps."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, Literal

import torch

from fl_lightning.algorithms.shared.aggregation import buffers_as_mean, weighted_sum
from fl_lightning.algorithms.shared.algorithm import Algorithm, ClientContext, ClientUpdate
from fl_lightning.algorithms.shared.server_optimizers import ServerOptimizer, ServerSGD
from fl_lightning.participation.participation_model import ParticipationModel
from fl_lightning.server.federation import Federation
from fl_lightning.server.model_state import State


def normalizing_norm(steps: int, momentum: float = 0.0) -> float:
    r""":math:`\lVert a_i\rVert_1` of a client that took ``steps`` local SGD steps with heavy-ball ``momentum`` ρ.

    Vanilla SGD has :math:`a_i = [1, \dots, 1]`, so :math:`\lVert a_i\rVert_1 = \tau_i`; local momentum
    has :math:`a_{i,k} = (1 - \rho^{\tau_i - k + 1}) / (1 - \rho)` (Wang et al. 2020, §4's examples of
    :math:`a_i`, SGD with momentum), i.e. :math:`\sum_{k=1}^{\tau_i} (1 - \rho^k)/(1 - \rho)`. Summed term by term as
    the authors' optimizer does (``c_k = \rho c_{k-1} + 1``), which is exact at ρ = 0.

    >>> normalizing_norm(4)
    4.0
    >>> normalizing_norm(3, momentum=0.5)  # 1 + 1.5 + 1.75
    4.25
    """
    counter = total = 0.0
    for _ in range(steps):
        counter = momentum * counter + 1.0
        total += counter
    return total


def local_momentum(optimizers: Sequence[torch.optim.Optimizer]) -> float:
    """The heavy-ball momentum of the module's one ``torch.optim.SGD`` optimizer; ``ValueError`` naming
    anything else, since :func:`normalizing_norm` is derived for plain or heavy-ball SGD only."""
    if len(optimizers) != 1 or type(optimizers[0]) is not torch.optim.SGD:
        names = [type(o).__name__ for o in optimizers]
        raise ValueError(
            f"FedNova normalises by the local solver's a_i, known for torch.optim.SGD (plain or with momentum); "
            f"the module configures {names}. Use one torch.optim.SGD optimizer."
        )
    groups = optimizers[0].param_groups
    momenta = {float(g["momentum"]) for g in groups}
    unsupported = {key: g[key] for g in groups for key in ("nesterov", "dampening") if g[key]}
    if len(momenta) != 1 or unsupported:
        raise ValueError(
            f"FedNova supports SGD with one heavy-ball momentum for every parameter group (no nesterov, "
            f"dampening=0); got momenta {sorted(momenta)} and {unsupported or 'no other option'}."
        )
    return momenta.pop()


class FedNova(Algorithm):
    r"""FedNova: each client's update is normalised by its amount of local work before averaging.

    Client :math:`i` runs :math:`\tau_i` local steps (its completed optimizer steps,
    ``ClientUpdate.num_steps``: heterogeneous with ``local_epochs`` over clients of different sizes, or
    with a ``participation`` model's incomplete work), giving :math:`\Delta_i = x^t - x_i^{t,\tau_i}`.
    With :math:`a_i` the local solver's weights on its gradients (:func:`normalizing_norm`) the server
    takes (Wang et al. 2020, §4's generalised update with §5's
    normalised averaging, where :math:`\eta d_i = \Delta_i / \lVert a_i\rVert_1`)

    .. math:: x^{t+1} = x^t - \tau_{\mathrm{eff}} \sum_i p_i \frac{\Delta_i}{\lVert a_i\rVert_1},
              \qquad \tau_{\mathrm{eff}} = \sum_i p_i \lVert a_i\rVert_1,

    the paper's choice of :math:`\tau_{\mathrm{eff}}`, through the ``server_optimizer`` as a delta
    (default: applied as is). With equal :math:`\tau_i` it is FedAvg.

    Choices where the paper is silent: :math:`p_i = n_i / \sum_{j \in S_t} n_j` over the round's
    reporting clients (the paper's analysis has every client report), ``weighting="uniform"`` for equal
    :math:`p_i`; a client with :math:`\tau_i = 0` (inactive) has no normalised gradient (0/0) and counts
    as not reporting.

    Buffers (BatchNorm running statistics, counters) are not normalised: they take the plain
    :math:`p_i`-weighted mean of their deltas, as FedAvg does (:func:`~fl_lightning.algorithms.shared.aggregation.buffers_as_mean`).
    The weights :math:`\tau_{\mathrm{eff}} p_i / \lVert a_i\rVert_1` sum to :math:`\ge 1`, so applied to a running
    variance they extrapolate it below zero under heterogeneous steps. The authors' code never rescales
    buffers either: its ``FedNova.average`` (JYWa/FedNova, ``distoptim/FedNova.py``) normalises only the
    optimizer's ``param_groups``, and BatchNorm statistics stay on each worker; with one server model the
    plain mean is the rule that keeps them the clients' statistics (a convex combination).

    Needs no client state (no :class:`~fl_lightning.server.client_store.ClientStore`): :math:`a_i` comes
    from the step count each update carries. Does not shard its clients over processes: the server step
    needs two sums over clients besides the deltas (:math:`\sum n_i` and :math:`\sum n_i\lVert a_i\rVert_1`),
    and the weighted-sum protocol carries one; for the same reason it composes with neither DP nor the
    robust aggregators (both refuse it). Each client's steps are drawn when its context is made (:meth:`plan_client`),
    before training, so the batched executor groups clients by them and trains FedNova as the sequential executors do.

    Args:
        participation: how many of the trainer's ``local_steps`` each client completes (flexible
            participation's incomplete work, :mod:`fl_lightning.participation`); default: all of its work.
        weighting: ``"samples"`` (default) or ``"uniform"`` :math:`p_i`.
        server_optimizer: applied to the normalised delta, e.g. ``ServerSGD(momentum=0.9)``.
    """

    needs_fresh_optimizer: ClassVar[str] = "FedNova's normaliser ||a_i||_1 counts the client's own steps from a zeroed momentum buffer"

    summary_metrics: ClassVar[dict[str, str]] = {"round/tau_eff": "mean"}

    def __init__(
        self,
        *,
        participation: ParticipationModel | None = None,
        weighting: Literal["samples", "uniform"] = "samples",
        server_optimizer: ServerOptimizer | None = None,
    ) -> None:
        if weighting not in ("samples", "uniform"):
            raise ValueError(f"`weighting` must be 'samples' or 'uniform', got {weighting!r}.")
        if participation is not None and not isinstance(participation, ParticipationModel):
            raise ValueError(f"`participation` must be a ParticipationModel or None, got {type(participation).__name__}.")
        self.participation = participation
        self.weighting = weighting
        self.server_optimizer = server_optimizer if server_optimizer is not None else ServerSGD()

    def unnoised_client_values(self) -> str:
        return "each client's step count (the normaliser ||a_i||_1) and, with weighting='samples', its sample count"

    def setup(self, federation: Federation) -> None:
        super().setup(federation)
        self.momentum = local_momentum(federation.services.optimizers())
        if self.participation is not None:
            if federation.local_steps is None:
                raise ValueError(
                    "FedNova's `participation` draws completed steps out of the requested local steps: set the "
                    "trainer's `local_steps`, not `local_epochs`."
                )
            self.participation.setup(num_clients=federation.num_clients, seed=federation.seed)

    def plan_client(self, client: ClientContext) -> None:
        if self.participation is not None:
            requested = self.federation.local_steps
            assert requested is not None  # checked in setup
            client.num_epochs = None
            client.num_steps = self.participation.completed_steps(client.client_id, client.round_idx, requested)

    def aggregate(self, round_idx: int, global_state: State, updates: list[ClientUpdate]) -> dict[str, float]:
        active = [u for u in updates if u.num_steps > 0]
        metrics = {"inactive_clients": float(len(updates) - len(active))}
        if not active:
            return metrics
        sizes = [float(u.num_samples) if self.weighting == "samples" else 1.0 for u in active]
        p = [n / sum(sizes) for n in sizes]
        norms = [normalizing_norm(u.num_steps, self.momentum) for u in active]
        tau_eff = sum(pi * a for pi, a in zip(p, norms))
        # The deltas are local - global = -Delta_i, so the step is +tau_eff * sum_i p_i delta_i / ||a_i||_1.
        payloads = [u.payload for u in active]
        delta = weighted_sum(payloads, [tau_eff * pi / a for pi, a in zip(p, norms)])
        # Buffers: the plain p_i-weighted mean (these weights sum to >= 1 and would extrapolate them).
        delta = buffers_as_mean(delta, payloads, p, self.federation.param_names)
        self.server_optimizer.step(global_state, delta, self.federation.param_names)
        return {**metrics, "tau_eff": tau_eff}

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {"server_optimizer": self.server_optimizer.state_dict()}
        if self.participation is not None:
            state["participation"] = self.participation.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.server_optimizer.load_state_dict(state["server_optimizer"])
        if self.participation is not None:
            self.participation.load_state_dict(state["participation"])

    def check_restored(self, rounds_done: int) -> None:
        self.server_optimizer.check_restored(rounds_done)
