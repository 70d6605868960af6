"""FedProx's proximal term as a LightningModule mixin."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor


class ProximalMixin:
    r"""Adds :math:`\frac{\mu}{2}\lVert w - w^t \rVert^2` to the training loss (FedProx, Li et al. 2020, eq. 2).

    Put it first among the bases so its ``training_step`` wraps yours::

        class MyFedProxModel(ProximalMixin, MyModel): ...

    The centre :math:`w^t` (the round's global weights) is detached and set by the algorithm
    before local training; with :math:`\mu = 0` nothing is added, so training equals FedAvg's
    bit for bit. Works with ``training_step`` returning a loss tensor or a dict with ``"loss"``.
    """

    _proximal_mu: float = 0.0
    _proximal_pairs: list[tuple[Tensor, Tensor]] = []

    def set_proximal_center(self, center: Mapping[str, Tensor], mu: float) -> None:
        """Sets :math:`w^t` (tensors by parameter name) and :math:`\\mu` for the coming local training."""
        if mu < 0:
            raise ValueError(f"Proximal coefficient `mu` must be >= 0, got {mu}.")
        self._proximal_mu = float(mu)
        self._proximal_pairs = [
            (param, center[name].detach())
            for name, param in self.named_parameters()  # type: ignore[attr-defined]
            if param.requires_grad
        ]

    def proximal_term(self) -> Tensor:
        r""":math:`\frac{\mu}{2}\sum_i \lVert w_i - w_i^t \rVert^2` over trainable parameters."""
        sq = sum(((p - c.to(p.dtype)) ** 2).sum() for p, c in self._proximal_pairs)
        return 0.5 * self._proximal_mu * torch.as_tensor(sq)

    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        output = super().training_step(*args, **kwargs)  # type: ignore[misc]
        if self._proximal_mu == 0.0 or output is None:
            return output
        if isinstance(output, Tensor):
            return output + self.proximal_term()
        return {**output, "loss": output["loss"] + self.proximal_term()}
