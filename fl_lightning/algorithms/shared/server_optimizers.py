r"""Server optimizers on the pseudo-gradient :math:`-\Delta_t` (Reddi et al. 2021, Algorithm 2).

:math:`\Delta_t` is the aggregated client delta of round :math:`t`. Only parameters go
through the optimizer; buffers (BatchNorm running statistics) always take the plain update
:math:`x \leftarrow x + \Delta_t`, because adaptive scaling of a running mean is meaningless.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Collection, Mapping
from typing import Any

import torch
from torch import Tensor
from typing_extensions import override

from fl_lightning.algorithms.shared.aggregation import apply_delta
from fl_lightning.server.model_state import State
from fl_lightning.utils.init_args import RecordsInitArgs
from fl_lightning.utils.saved_state import InvalidStateError, check_tensor
from fl_lightning.utils.checks import positive


def _check_unit_interval(name: str, value: float) -> None:
    if not 0.0 <= value < 1.0:
        raise ValueError(f"`{name}` must be in [0, 1), got {value}.")


class ServerOptimizer(RecordsInitArgs, ABC):
    """Turns the round's aggregated delta into a new global model."""

    def __init__(self, *, lr: float) -> None:
        positive("lr", lr)  # the server learning rate
        self.lr = lr
        self.state: dict[str, State] = {}

    @torch.no_grad()
    def step(self, global_state: State, delta: Mapping[str, Tensor], param_names: Collection[str]) -> None:
        """Updates ``global_state`` in place."""
        params = {k: v for k, v in global_state.items() if k in param_names}
        buffers = {k: v for k, v in global_state.items() if k not in param_names}
        apply_delta(buffers, delta)
        for name, x in params.items():
            self._update(name, x, delta[name].to(x.dtype))

    @abstractmethod
    def _update(self, name: str, x: Tensor, delta: Tensor) -> None:
        """Updates one parameter ``x`` in place given its aggregated delta."""

    def _buffer(self, slot: str, name: str, like: Tensor, fill: float = 0.0) -> Tensor:
        slots = self.state.setdefault(slot, {})
        if name not in slots:
            slots[name] = torch.full_like(like, fill)
        return slots[name]

    @property
    def slots(self) -> tuple[str, ...]:
        """The per-parameter state this optimizer keeps once it has stepped (empty: none)."""
        return ()

    def state_dict(self) -> dict[str, Any]:
        return {slot: {k: v.clone() for k, v in tensors.items()} for slot, tensors in self.state.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restores :meth:`state_dict`, checked to be what stepping produces: nothing, or every slot of
        :attr:`slots` for the same parameters, each finite and in range (:meth:`_check_state`).

        Raises:
            InvalidStateError: naming the slot or moment and what is allowed.
        """
        kept = " and ".join(f"`{slot}`" for slot in self.slots) or "no state"
        if not isinstance(state, Mapping) or (state and set(state) != set(self.slots)):
            found = sorted(state) if isinstance(state, Mapping) else type(state).__name__
            raise InvalidStateError(f"`server_optimizer` holds {found}, but {type(self).__name__} keeps {kept} once it has stepped.")
        names = [sorted(tensors) for tensors in state.values()]
        if any(n != names[0] for n in names):
            raise InvalidStateError(f"`server_optimizer`'s {kept} must cover the same parameters, got {dict(zip(state, names))}.")
        for slot, tensors in state.items():
            for name, value in tensors.items():
                check_tensor(f"server_optimizer.{slot}.{name}", value)
        if state:
            self._check_state(state)
        self.state = {slot: dict(tensors) for slot, tensors in state.items()}

    def _check_state(self, state: Mapping[str, Mapping[str, Tensor]]) -> None:
        """Checks the ranges of a saved state whose slots and finiteness are checked."""

    def check_restored(self, rounds_done: int) -> None:
        """An optimizer that keeps moments has them once a round has stepped it (a run whose every round so far
        had no update to apply has none, and is refused too: resume it from its first checkpoint)."""
        if rounds_done and self.slots and not self.state:
            raise InvalidStateError(
                f"`server_optimizer` has no {' and '.join(self.slots)} after {rounds_done} rounds: "
                f"{type(self).__name__}'s moments were removed."
            )


class ServerSGD(ServerOptimizer):
    r"""Server SGD, with momentum = FedAvgM (Hsu et al. 2019).

    .. math:: v_t = \beta v_{t-1} + \Delta_t, \qquad x_{t+1} = x_t + \eta\, v_t

    ``lr=1, momentum=0`` is plain FedAvg, bit for bit.
    """

    def __init__(self, *, lr: float = 1.0, momentum: float = 0.0) -> None:
        super().__init__(lr=lr)
        _check_unit_interval("momentum", momentum)
        self.momentum = momentum

    @property
    @override
    def slots(self) -> tuple[str, ...]:
        return ("momentum",) if self.momentum else ()

    def _update(self, name: str, x: Tensor, delta: Tensor) -> None:
        if self.momentum:
            v = self._buffer("momentum", name, x)
            delta = v.mul_(self.momentum).add_(delta)
        x.add_(delta, alpha=self.lr)


class _AdaptiveServerOptimizer(ServerOptimizer):
    r"""Reddi et al. 2021, Algorithm 2: :math:`m_t = \beta_1 m_{t-1} + (1-\beta_1)\Delta_t`,
    :math:`x_{t+1} = x_t + \eta\, m_t / (\sqrt{v_t} + \tau)`, with :math:`v_{-1} = \tau^2` and
    no bias correction; subclasses define the second moment :math:`v_t`.
    """

    def __init__(self, *, lr: float = 1e-2, beta1: float = 0.9, beta2: float = 0.99, tau: float = 1e-3) -> None:
        super().__init__(lr=lr)
        _check_unit_interval("beta1", beta1)
        _check_unit_interval("beta2", beta2)
        positive("tau", tau)  # the adaptivity
        self.beta1, self.beta2, self.tau = beta1, beta2, tau

    @property
    @override
    def slots(self) -> tuple[str, ...]:
        return ("m", "v")

    @override
    def _check_state(self, state: Mapping[str, Mapping[str, Tensor]]) -> None:
        r"""Every second moment is positive (:math:`v_{-1} = \tau^2` and each update keeps it so), and where
        :meth:`_first_moment_bound` gives one, :math:`|m| \le c\sqrt{v}`."""
        bound = self._first_moment_bound()
        for name, v in state["v"].items():
            m = state["m"][name]
            if not bool((v > 0).all()):
                raise InvalidStateError(f"`server_optimizer.v.{name}` must be > 0 (it starts at tau^2 = {self.tau**2:g}), got 0.")
            if bound is not None and m.shape == v.shape and bool((m.abs() > bound * v.sqrt() * (1 + 1e-6)).any()):
                ratio = float((m.abs() / v.sqrt()).max())
                raise InvalidStateError(
                    f"`server_optimizer.m.{name}` is out of range: |m| / sqrt(v) reaches {ratio:.4g}, but {type(self).__name__}"
                    f"(beta1={self.beta1}, beta2={self.beta2}) keeps it <= {bound:.4g}."
                )

    def _first_moment_bound(self) -> float | None:
        r""":math:`c` with :math:`|m_t| \le c\sqrt{v_t}` for every run, or ``None`` where there is none."""
        return None

    def _update(self, name: str, x: Tensor, delta: Tensor) -> None:
        m = self._buffer("m", name, x).mul_(self.beta1).add_(delta, alpha=1 - self.beta1)
        v = self._second_moment(self._buffer("v", name, x, fill=self.tau**2), delta.square())
        x.addcdiv_(m, v.sqrt().add_(self.tau), value=self.lr)

    @abstractmethod
    def _second_moment(self, v: Tensor, delta_sq: Tensor) -> Tensor:
        """Updates ``v`` in place and returns it."""


class ServerAdagrad(_AdaptiveServerOptimizer):
    r"""FedAdagrad: :math:`v_t = v_{t-1} + \Delta_t^2`."""

    def _second_moment(self, v: Tensor, delta_sq: Tensor) -> Tensor:
        return v.add_(delta_sq)

    @override
    def _first_moment_bound(self) -> float:
        r""":math:`v_t \ge \Delta_k^2` for every past :math:`k`, so :math:`|m_t| \le (1-\beta_1)\sum_j \beta_1^j \sqrt{v_t}
        \le \sqrt{v_t}`."""
        return 1.0


class ServerAdam(_AdaptiveServerOptimizer):
    r"""FedAdam: :math:`v_t = \beta_2 v_{t-1} + (1-\beta_2)\Delta_t^2`."""

    def _second_moment(self, v: Tensor, delta_sq: Tensor) -> Tensor:
        return v.mul_(self.beta2).add_(delta_sq, alpha=1 - self.beta2)

    @override
    def _first_moment_bound(self) -> float | None:
        r""":math:`v_t \ge (1-\beta_2)\beta_2^{j}\Delta_{t-j}^2`, so :math:`|m_t| \le (1-\beta_1)\sum_j \beta_1^j |\Delta_{t-j}|
        \le \frac{1-\beta_1}{\sqrt{1-\beta_2}\,(1-\beta_1/\sqrt{\beta_2})}\sqrt{v_t}` when :math:`\beta_1 < \sqrt{\beta_2}`."""
        ratio = self.beta1 / math.sqrt(self.beta2) if self.beta2 > 0 else math.inf
        return (1 - self.beta1) / (math.sqrt(1 - self.beta2) * (1 - ratio)) if ratio < 1 else None


class ServerYogi(_AdaptiveServerOptimizer):
    r"""FedYogi: :math:`v_t = v_{t-1} - (1-\beta_2)\Delta_t^2 \operatorname{sign}(v_{t-1} - \Delta_t^2)`."""

    def _second_moment(self, v: Tensor, delta_sq: Tensor) -> Tensor:
        return v.sub_(delta_sq * torch.sign(v - delta_sq), alpha=1 - self.beta2)
