"""FedAsync (Xie et al., "Asynchronous Federated Optimization", arXiv:1903.03934, 2019): the server
mixes every arriving local model into the global one, with a weight that decays with staleness."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import lightning.pytorch as pl
from typing_extensions import override

from fl_lightning.algorithms.shared.aggregation import apply_delta
from fl_lightning.algorithms.shared.asynchronous import AsyncAlgorithm, PullPolicy, TrainAt
from fl_lightning.algorithms.shared.algorithm import ClientContext, ClientUpdate
from fl_lightning.server.federation import Federation
from fl_lightning.mixins.required import require_mixin
from fl_lightning.mixins.proximal import ProximalMixin
from fl_lightning.server.model_state import State, compute_delta, snapshot
from fl_lightning.participation.speed import DelayModel
from fl_lightning.utils.checks import non_negative, positive

StalenessFunction = Literal["constant", "polynomial", "hinge"]


def staleness_weight(function: StalenessFunction, gap: int, *, a: float, b: float) -> float:
    r""":math:`s(t - \tau)` of FedAsync (Xie et al. 2019, §5.2), for ``gap`` :math:`= t - \tau \ge 1`.

    - ``"constant"``: :math:`s = 1`;
    - ``"polynomial"``: :math:`s_a = (t - \tau + 1)^{-a}`;
    - ``"hinge"``: :math:`s_{a,b} = 1` if :math:`t - \tau \le b`, else :math:`1 / (a(t - \tau - b) + 1)`.

    >>> staleness_weight("polynomial", 3, a=0.5, b=4)
    0.5
    >>> staleness_weight("hinge", 6, a=10, b=4)
    0.047619047619047616
    """
    if function == "constant":
        return 1.0
    if function == "polynomial":
        return float((gap + 1) ** -a)
    if function == "hinge":
        return 1.0 if gap <= b else 1.0 / (a * (gap - b) + 1.0)
    raise ValueError(f"`staleness` must be 'constant', 'polynomial' or 'hinge', got {function!r}.")


class FedAsync(AsyncAlgorithm):
    r"""Asynchronous federated optimization (Xie et al. 2019, Algorithm 1).

    A client pulls the global model :math:`x_\tau`, runs its local steps on
    :math:`f(x) + \frac{\rho}{2}\lVert x - x_\tau\rVert^2` (the proximal term needs
    :class:`~fl_lightning.ProximalMixin` when :math:`\rho > 0`; :math:`\rho = 0` is plain local SGD)
    and uploads its local model :math:`x_{new}`. The server updates on every arrival (no buffer):

    .. math::

        \alpha_t = \alpha\, s(t - \tau), \qquad x_t = (1 - \alpha_t)\, x_{t-1} + \alpha_t\, x_{new}

    with :func:`staleness_weight` :math:`s`. Indexing as in the paper: the arrival produces
    :math:`x_t` from :math:`x_{t-1}`, so an update trained on the newest model has
    :math:`t - \tau = 1` (the loop's ``staleness`` + 1). Buffers are mixed like parameters;
    integer buffers (``num_batches_tracked``) move by the rounded increment
    :math:`\alpha_t (x_{new} - x_{t-1})`. The paper's periodic scheduler is the loop's pull rule
    (every client in flight by default, ``concurrency`` and ``delays`` as in
    :class:`~fl_lightning.algorithms.shared.asynchronous.AsyncAlgorithm`).

    Args:
        alpha: mixing hyper-parameter :math:`\alpha \in (0, 1]` (paper: 0.6 or 0.9).
        staleness: ``"constant"``, ``"polynomial"`` or ``"hinge"``.
        a: :math:`a > 0` of the polynomial (paper: 0.5) and hinge (paper: 10) functions.
        b: :math:`b \ge 0` of the hinge function (paper: 4).
        rho: proximal coefficient :math:`\rho \ge 0` (paper: 0.005 or 0.01).
        concurrency, delays, pull_policy, train_at: see
            :class:`~fl_lightning.algorithms.shared.asynchronous.AsyncAlgorithm`.
    """

    def __init__(
        self,
        *,
        alpha: float = 0.6,
        staleness: StalenessFunction = "constant",
        a: float = 0.5,
        b: float = 4,
        rho: float = 0.0,
        concurrency: int | None = None,
        delays: DelayModel | None = None,
        pull_policy: PullPolicy = "immediate",
        train_at: TrainAt = "dispatch",
    ) -> None:
        super().__init__(buffer_size=1, concurrency=concurrency, delays=delays, pull_policy=pull_policy, train_at=train_at)
        if not 0 < alpha <= 1:
            raise ValueError(f"FedAsync's mixing `alpha` must be in (0, 1], got {alpha!r}.")
        if staleness not in ("constant", "polynomial", "hinge"):
            raise ValueError(f"`staleness` must be 'constant', 'polynomial' or 'hinge', got {staleness!r}.")
        positive("a", a)  # the staleness function's exponent or slope
        non_negative("b", b)  # the hinge function's knee
        non_negative("rho", rho)  # the proximal coefficient
        self.alpha, self.staleness, self.a, self.b, self.rho = float(alpha), staleness, float(a), float(b), float(rho)

    @override
    def setup(self, federation: Federation) -> None:
        if self.rho > 0:
            require_mixin(federation.module, ProximalMixin, self)
        super().setup(federation)

    @override
    def configure_client(self, client: ClientContext, module: pl.LightningModule, global_state: State) -> None:
        if self.rho > 0:
            module.set_proximal_center(global_state, self.rho)  # type: ignore[attr-defined]

    @property
    @override
    def uploads_deltas(self) -> bool:
        """No: a client uploads its local model :math:`x_{new}`, so no update bound applies."""
        return False

    @override
    def client_update(self, client: ClientContext, module: pl.LightningModule, delta: State) -> ClientUpdate:
        """Uploads the local model :math:`x_{new}` (a float32 copy), not the delta."""
        return super().client_update(client, module, snapshot(self.federation.local_weights()))

    @override
    def buffer_weights(self, updates: Sequence[ClientUpdate]) -> list[float]:
        r""":math:`\alpha_t = \alpha\, s(t - \tau)` with :math:`t - \tau` = ``staleness`` + 1."""
        return [self.alpha * staleness_weight(self.staleness, u.staleness + 1, a=self.a, b=self.b) for u in updates]

    @override
    def aggregate(self, round_idx: int, global_state: State, updates: list[ClientUpdate]) -> dict[str, float]:
        (update,) = updates  # buffer_size is 1: the server updates on every arrival
        (alpha_t,) = self.buffer_weights(updates)
        # x_t = (1 - a_t) x_{t-1} + a_t x_new, written as x_{t-1} + a_t (x_new - x_{t-1}).
        apply_delta(global_state, compute_delta(update.payload, global_state), scale=alpha_t)
        self.record_influence(updates, [alpha_t])
        staleness = float(update.staleness)
        return {"alpha": alpha_t, "mean_staleness": staleness, "max_staleness": staleness}
