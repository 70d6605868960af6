r"""Server optimizers on the pseudo-gradient :math:`-\Delta_t` (Reddi et al. 2021, Algorithm 2).

:math:`\Delta_t` is the aggregated client delta of round :math:`t`. Only parameters go
through the optimizer; buffers (BatchNorm running statistics) always take the plain update
:math:`x \leftarrow x + \Delta_t`, because adaptive scaling of a running mean is meaningless.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection, Mapping
from typing import Any

import torch
from torch import Tensor

from fl_lightning.algorithms.shared.aggregation import apply_delta
from fl_lightning.server.model_state import State
from fl_lightning.utils.init_args import RecordsInitArgs
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

    def state_dict(self) -> dict[str, Any]:
        return {slot: {k: v.clone() for k, v in tensors.items()} for slot, tensors in self.state.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.state = {slot: dict(tensors) for slot, tensors in state.items()}


class ServerSGD(ServerOptimizer):
    r"""Server SGD, with momentum = FedAvgM (Hsu et al. 2019).

    .. math:: v_t = \beta v_{t-1} + \Delta_t, \qquad x_{t+1} = x_t + \eta\, v_t

    ``lr=1, momentum=0`` is plain FedAvg, bit for bit.
    """

    def __init__(self, *, lr: float = 1.0, momentum: float = 0.0) -> None:
        super().__init__(lr=lr)
        _check_unit_interval("momentum", momentum)
        self.momentum = momentum

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


class ServerAdam(_AdaptiveServerOptimizer):
    r"""FedAdam: :math:`v_t = \beta_2 v_{t-1} + (1-\beta_2)\Delta_t^2`."""

    def _second_moment(self, v: Tensor, delta_sq: Tensor) -> Tensor:
        return v.mul_(self.beta2).add_(delta_sq, alpha=1 - self.beta2)


class ServerYogi(_AdaptiveServerOptimizer):
    r"""FedYogi: :math:`v_t = v_{t-1} - (1-\beta_2)\Delta_t^2 \operatorname{sign}(v_{t-1} - \Delta_t^2)`."""

    def _second_moment(self, v: Tensor, delta_sq: Tensor) -> Tensor:
        return v.sub_(delta_sq * torch.sign(v - delta_sq), alpha=1 - self.beta2)
