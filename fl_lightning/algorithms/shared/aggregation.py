r"""Pure aggregation functions over model deltas (``delta = local - global``).

Rule for integer tensors (BatchNorm's ``num_batches_tracked``): they are combined with the
same weights as floating-point tensors and the result is rounded to the nearest integer, so a
counter advances by the weighted-mean number of batches the clients tracked.

Rule for buffers under weights that do not sum to 1 (FedNova's :math:`\tau_{\mathrm{eff}} p_i/\lVert a_i\rVert_1`,
FlexibleParticipation's debiased coefficients): buffers (BatchNorm running statistics, counters) are not
parameters and take no such rescaling; they take the plain mean of their deltas with the clients' weights
:math:`p_i` (:func:`buffers_as_mean`), a convex combination of the clients' statistics, so a running
variance stays positive. Extrapolating them (weights summing to more than 1) turns it negative.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

import torch
from torch import Tensor

from fl_lightning.server.model_state import State


def weighted_sum(deltas: Sequence[Mapping[str, Tensor]], weights: Sequence[float]) -> State:
    r"""Accumulates :math:`\sum_k w_k \Delta_k` in at least float32 (integer tensors in float64, unrounded).

    Clients are summed in the order given, so the result is reproducible bit for bit.

    >>> d = [{"w": torch.tensor([1.0, 2.0])}, {"w": torch.tensor([3.0, 4.0])}]
    >>> weighted_sum(d, [0.5, 2.0])["w"]
    tensor([6.5000, 9.0000])
    """
    if len(deltas) != len(weights):
        raise ValueError(f"Got {len(deltas)} deltas but {len(weights)} weights.")
    if not deltas:
        raise ValueError("Cannot aggregate an empty list of deltas.")
    running = RunningSum()
    for delta, weight in zip(deltas, weights):
        running.add(delta, weight)
    return running.total


class RunningSum:
    r""":math:`\sum_k w_k \Delta_k` and :math:`\sum_k w_k`, folded in one client at a time (:func:`weighted_sum`'s
    operations in the same order, so the same bits), for an aggregation that never holds a round's deltas at once.

    >>> running = RunningSum()
    >>> running.add({"w": torch.tensor([1.0, 2.0])}, 0.5)
    >>> running.add({"w": torch.tensor([3.0, 4.0])}, 2.0)
    >>> running.total["w"], running.weight, running.count
    (tensor([6.5000, 9.0000]), 2.5, 2)
    """

    def __init__(self) -> None:
        #: The weighted sum so far (empty before the first :meth:`add`).
        self.total: State = {}
        #: The sum of the weights so far, accumulated in Python floats from 0 as ``sum(weights)`` does.
        self.weight = 0.0
        #: How many deltas were added.
        self.count = 0

    def add(self, delta: Mapping[str, Tensor], weight: float) -> None:
        """Adds ``weight * delta`` (at least float32; integer tensors in float64, unrounded)."""
        if not self.total:
            self.total = {name: torch.zeros_like(t, dtype=accumulator_dtype(t.dtype)) for name, t in delta.items()}
        if self.total:  # one _foreach call: each accumulator's own add_ on a CPU, without a dispatch per tensor
            # t.to(dtype) only where it converts: its dispatch would run once per tensor and client.
            addends = [t if (t := delta[name]).dtype == acc.dtype else t.to(acc.dtype) for name, acc in self.total.items()]
            torch._foreach_add_(list(self.total.values()), addends, alpha=float(weight))
        self.weight += float(weight)
        self.count += 1


def weighted_average(deltas: Sequence[Mapping[str, Tensor]], weights: Sequence[float]) -> State:
    r"""FedAvg's :math:`\sum_k w_k \Delta_k / \sum_k w_k` (McMahan et al. 2017, Algorithm 1).

    >>> d = [{"w": torch.tensor([1.0])}, {"w": torch.tensor([4.0])}]
    >>> weighted_average(d, [3, 1])["w"]
    tensor([1.7500])
    """
    norm = float(sum(weights))
    if norm <= 0:
        raise ValueError(f"Aggregation weights must sum to a positive number, got {list(weights)}.")
    return {name: t.div_(norm) for name, t in weighted_sum(deltas, weights).items()}


def buffers_as_mean(
    total: State, deltas: Sequence[Mapping[str, Tensor]], weights: Sequence[float], param_names: Collection[str]
) -> State:
    """``total`` with every entry that is not in ``param_names`` replaced by :func:`weighted_average` of the
    ``deltas``' entries under ``weights`` (the module rule above); parameters are left as they are.

    >>> d = [{"w": torch.tensor([1.0]), "var": torch.tensor([-1.0])}, {"w": torch.tensor([1.0]), "var": torch.tensor([-0.5])}]
    >>> buffers_as_mean(weighted_sum(d, [3.0, 3.0]), d, [1.0, 1.0], {"w"})
    {'w': tensor([6.]), 'var': tensor([-0.7500])}
    """
    buffers = [name for name in total if name not in param_names]
    if buffers:
        mean = weighted_average([{name: delta[name] for name in buffers} for delta in deltas], weights)
        total = {**total, **mean}
    return total


def accumulator_dtype(dtype: torch.dtype) -> torch.dtype:
    """Aggregation dtype: at least float32 for floating-point tensors, float64 for integer counters."""
    return torch.promote_types(dtype, torch.float32) if dtype.is_floating_point else torch.float64


@torch.no_grad()
def apply_delta(state: Mapping[str, Tensor], delta: Mapping[str, Tensor], *, scale: float = 1.0) -> None:
    """``state += scale * delta`` in place; integer tensors get the rounded increment."""
    for name, target in state.items():
        step = delta[name].to(accumulator_dtype(target.dtype)) * scale
        if target.is_floating_point():
            target.add_(step)
        else:
            target.add_(torch.round(step).to(target.dtype))
