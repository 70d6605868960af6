"""Proximal terms as a LightningModule mixin: FedProx's single centre, FedSoft's several."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor

from fl_lightning.mixins.applied_term import AppliedTermMixin, ClientTerm, attribute_set, term_step
from fl_lightning.mixins.regularized import add_regularizer


class ProximalMixin(AppliedTermMixin):
    r"""Adds :math:`\frac{\mu}{2}\lVert w - w^t \rVert^2` to the training loss (FedProx, Li et al. 2020, eq. 2).

    Put it first among the bases so its ``training_step`` wraps yours::

        class MyFedProxModel(ProximalMixin, MyModel): ...

    The centre :math:`w^t` (the round's global weights) is detached and set by the algorithm
    before local training; with :math:`\mu = 0` nothing is added, so training equals FedAvg's
    bit for bit. Works with ``training_step`` returning a loss tensor or a dict with ``"loss"``;
    the result is a dict whose ``"loss"`` includes the term and whose ``"task_loss"`` and
    ``"regularizer"`` keep the two apart (:func:`~fl_lightning.mixins.regularized.add_regularizer`).

    :meth:`set_proximal_centers` pulls towards several weighted centres instead (FedSoft's
    :math:`\frac{\lambda}{2}\sum_s u_s \lVert w - c_s \rVert^2`, Ruan & Joe-Wong 2022, eq. 4).
    """

    _proximal_mu: float = 0.0
    _proximal_pairs: list[tuple[Tensor, Tensor]] = []
    #: The parameter names of :attr:`_proximal_pairs`, in order.
    _proximal_names: list[str] = []
    #: Constant part of a multi-centre term (0 for a single centre); it carries no gradient.
    _proximal_offset: Tensor | None = None
    #: :math:`\mu / 2` of the client a batched group binds (:meth:`term_bound_to`), a 0-d tensor that may differ
    #: between the group's clients; ``None`` outside a batched step, where the Python float :attr:`_proximal_mu` is read.
    _proximal_half_mu: Tensor | None = None

    def set_proximal_center(self, center: Mapping[str, Tensor], mu: float) -> None:
        """Sets :math:`w^t` (tensors by parameter name) and :math:`\\mu` for the coming local training."""
        if mu < 0:
            raise ValueError(f"Proximal coefficient `mu` must be >= 0, got {mu}.")
        self._proximal_mu = float(mu)
        self._proximal_offset = None
        # The centre holds the shared tensors: a client's local parameters (federated_parameters) have none.
        named = [(name, p) for name, p in self.named_parameters() if p.requires_grad and name in center]  # type: ignore[attr-defined]
        self._proximal_names = [name for name, _ in named]
        self._proximal_pairs = [(param, center[name].detach()) for name, param in named]
        self._set_term(ProximalMixin, self._proximal_mu != 0.0)

    @torch.no_grad()
    def set_proximal_centers(
        self, centers: Sequence[Mapping[str, Tensor]], weights: Sequence[float] | Tensor, lam: float
    ) -> None:
        r"""Sets :math:`S` centres :math:`c_s` with weights :math:`u_s \ge 0`: the term becomes
        :math:`\frac{\lambda}{2}\sum_s u_s \lVert w - c_s \rVert^2`.

        It is kept as one mixed centre :math:`\bar c = \sum_s u_s c_s / U`, :math:`U = \sum_s u_s`,
        with coefficient :math:`\mu = \lambda U`, plus the constant
        :math:`\frac{\lambda}{2}\sum_s u_s \lVert c_s - \bar c \rVert^2`; since
        :math:`\sum_s u_s \lVert w - c_s\rVert^2 = U\lVert w - \bar c\rVert^2 + \sum_s u_s\lVert c_s - \bar c\rVert^2`,
        the value and the gradient :math:`\lambda \sum_s u_s (w - c_s)` are exact while one
        centre is held on the device. ``lam = 0`` (or all weights 0) adds nothing.
        """
        weights = [float(u) for u in (weights.tolist() if isinstance(weights, Tensor) else weights)]
        if lam < 0:
            raise ValueError(f"Proximal coefficient `lam` must be >= 0, got {lam}.")
        if not centers or len(weights) != len(centers):
            raise ValueError(f"Need one weight per centre and at least one centre; got {len(centers)} centres, {len(weights)} weights.")
        if any(not u >= 0 for u in weights):
            raise ValueError(f"Centre weights must be >= 0, got {weights}.")
        total = sum(weights)
        if lam == 0 or total == 0:
            self.set_proximal_center(centers[0], 0.0)
            return
        mixed: dict[str, Tensor] = {}
        offset = None
        for name, param in self.named_parameters():  # type: ignore[attr-defined]
            if not param.requires_grad or name not in centers[0]:
                continue
            stack = [c[name].detach().to(device=param.device, dtype=torch.promote_types(param.dtype, torch.float32)) for c in centers]
            mean = sum(u * c for u, c in zip(weights, stack)) / total
            spread = sum(u * ((c - mean) ** 2).sum() for u, c in zip(weights, stack))
            mixed[name] = mean
            offset = spread if offset is None else offset + spread
        self.set_proximal_center(mixed, lam * total)
        self._proximal_offset = None if offset is None else 0.5 * lam * offset

    def proximal_term(self) -> Tensor:
        r""":math:`\frac{\mu}{2}\sum_i \lVert w_i - w_i^t \rVert^2` over the shared trainable parameters
        (plus the constant of a multi-centre term)."""
        sq = torch.as_tensor(sum(((p - c.to(p.dtype)) ** 2).sum() for p, c in self._proximal_pairs))
        if self._proximal_half_mu is None:
            term = 0.5 * self._proximal_mu * sq
        else:
            # Both 0-d, so the product takes the wider dtype; computed there and rounded to sq's, it is bit for bit the
            # Python float's product above (which computes in float32 for a float32, bfloat16 or float16 sq).
            term = (self._proximal_half_mu * sq).to(sq.dtype)
        return term if self._proximal_offset is None else term + self._proximal_offset

    def client_term(self) -> ClientTerm | None:
        r"""The centre by parameter name; :math:`\mu / 2` and the multi-centre constant as per-client scalars."""
        pairs = self._proximal_pairs
        dtype = torch.promote_types(pairs[0][0].dtype, torch.float32) if pairs else torch.get_default_dtype()
        device = pairs[0][1].device if pairs else None
        scalars = {".half_mu": torch.tensor(0.5 * self._proximal_mu, dtype=dtype, device=device)}
        if self._proximal_offset is not None:
            scalars[".offset"] = self._proximal_offset
        return ClientTerm(dict(zip(self._proximal_names, (c for _, c in pairs))), scalars=scalars)

    @contextmanager
    def term_bound_to(self, params: Mapping[str, Tensor], tensors: Mapping[str, Tensor]) -> Iterator[None]:
        offset = tensors.get(".offset")
        with (
            attribute_set(self, "_proximal_pairs", [(params[name], tensors[name]) for name in self._proximal_names]),
            attribute_set(self, "_proximal_half_mu", tensors[".half_mu"]),
            attribute_set(self, "_proximal_offset", offset),
        ):
            yield

    @term_step
    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        output = super().training_step(*args, **kwargs)  # type: ignore[misc]
        if self._proximal_mu == 0.0 or output is None:
            return output
        self._count_term_step(ProximalMixin)
        # The loop logs the task loss as ``train_loss`` and the term as ``train_regularizer``.
        return add_regularizer(output, self.proximal_term())
