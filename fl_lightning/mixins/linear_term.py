"""A linear term in the local objective as a LightningModule mixin: SCAFFOLD's and FedDyn's corrections."""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import Any

import torch
from torch import Tensor

from fl_lightning.mixins.applied_term import AppliedTermMixin, ClientTerm, attribute_set, term_step
from fl_lightning.mixins.regularized import add_regularizer


class LinearTermMixin(AppliedTermMixin):
    r"""Adds :math:`\langle w, v \rangle = \sum_i \langle w_i, v_i \rangle` to the training loss.

    Its gradient is exactly :math:`v`, so a linear term is an exact gradient correction under every executor
    (the batched executor stacks each client's :math:`v`, :meth:`client_term`): SCAFFOLD's :math:`v = c - c_i` turns a local step into
    :math:`y \leftarrow y - \eta_l (g_i(y) - c_i + c)` (Karimireddy et al. 2020, Algorithm 1, line 10);
    FedDyn's :math:`v = -\nabla L_k(\theta_k^{t-1})` is its linear term (Acar et al. 2021, Algorithm 1).
    Put it first among the bases so its ``training_step`` wraps yours::

        class MyModel(LinearTermMixin, ProximalMixin, MyNet): ...

    The direction :math:`v` (tensors by parameter name, detached) is set by the algorithm before
    local training; with none set nothing is added, so training equals FedAvg's bit for bit. The
    loop reports the task loss as ``train_loss`` and the term as ``train_regularizer``
    (:func:`~fl_lightning.mixins.regularized.add_regularizer`).
    """

    _linear_pairs: list[tuple[Tensor, Tensor]] = []
    #: The parameter names of :attr:`_linear_pairs`, in order.
    _linear_names: list[str] = []

    def set_linear_term(self, direction: Mapping[str, Tensor] | None) -> None:
        """Sets :math:`v` for the coming local training (one tensor per shared trainable parameter), or removes the term
        (``None``)."""
        if direction is None:
            self._linear_pairs, self._linear_names = [], []
            self._set_term(LinearTermMixin, False)
            return
        # The shared parameters: a client's local ones (federated_parameters) have no server direction.
        params = [(name, p) for name, p in self.named_parameters() if p.requires_grad and name in direction]  # type: ignore[attr-defined]
        unknown = sorted(set(direction) - {name for name, _ in params})
        if unknown:
            raise ValueError(f"The linear term's direction names {unknown}, which are not trainable parameters of the module.")
        self._linear_names = [name for name, _ in params]
        self._linear_pairs = [(p, direction[name].detach().to(device=p.device, dtype=p.dtype)) for name, p in params]
        self._set_term(LinearTermMixin, bool(self._linear_pairs))  # training_step adds nothing without pairs

    def linear_term(self) -> Tensor:
        r""":math:`\sum_i \langle w_i, v_i \rangle` over the shared trainable parameters."""
        return torch.as_tensor(sum((p * v).sum() for p, v in self._linear_pairs))

    def client_term(self) -> ClientTerm | None:
        """The direction :math:`v` by parameter name."""
        return ClientTerm(dict(zip(self._linear_names, (v for _, v in self._linear_pairs))))

    def term_bound_to(self, params: Mapping[str, Tensor], tensors: Mapping[str, Tensor]) -> AbstractContextManager[None]:
        return attribute_set(self, "_linear_pairs", [(params[name], tensors[name]) for name in self._linear_names])

    @term_step
    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        output = super().training_step(*args, **kwargs)  # type: ignore[misc]
        if not self._linear_pairs or output is None:
            return output
        self._count_term_step(LinearTermMixin)
        return add_regularizer(output, self.linear_term())

