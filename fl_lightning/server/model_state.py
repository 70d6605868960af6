"""The global model's tensors: snapshots, in-place loading and deltas.

The server keeps a *master copy* of every floating-point tensor in the module's
``state_dict`` (parameters and buffers such as BatchNorm running statistics) in at least
float32 (float64 stays float64) whatever the module's own precision, and loads it into the module in place with ``copy_`` so optimizers,
DDP and ``torch.compile`` keep valid references to the parameters.
"""

from __future__ import annotations

import math
from operator import attrgetter
from collections.abc import Mapping

import torch
from torch import Tensor, nn

from fl_lightning.utils.scalars import read_scalars

State = dict[str, Tensor]


def live_tensors(module: nn.Module) -> State:
    """The module's parameters and persistent buffers, by ``state_dict`` name, sharing storage."""
    return dict(module.state_dict(keep_vars=True))


def snapshot(tensors: Mapping[str, Tensor]) -> State:
    """Detached copies: floating-point tensors in at least float32, integer tensors (counters) as they are."""
    return {
        name: t.detach().to(_master_dtype(t.dtype), copy=True) if t.is_floating_point() else t.detach().clone()
        for name, t in tensors.items()
    }


def _master_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)


def load_into(live: Mapping[str, Tensor], state: Mapping[str, Tensor]) -> None:
    """Copies ``state`` into the live tensors in place (casting to each tensor's own dtype).

    One ``_foreach`` call (each tensor's own ``copy_`` on a CPU, the same bits) on detached aliases, which autograd
    does not track without a ``no_grad`` context (six Python calls): it runs once per client, where each call is a
    measurable share of a small model's round (``benchmarks/executor_pace.py``).
    """
    if live:
        torch._foreach_copy_([t.detach() for t in live.values()], [state[name] for name in live])


def compute_delta(live: Mapping[str, Tensor], reference: Mapping[str, Tensor]) -> State:
    """``live - reference`` per tensor, in the master copy's dtype for floating-point tensors (one ``_foreach``
    subtraction of detached aliases, as :func:`load_into`)."""
    if not live:
        return {}
    references = [reference[name] for name in live]
    operands = [
        t.detach().to(ref.dtype) if t.is_floating_point() and t.dtype != ref.dtype else t.detach()
        for t, ref in zip(live.values(), references)
    ]
    return dict(zip(live, torch._foreach_sub(operands, references)))


def moved(state: Mapping[str, Tensor], device: torch.device) -> State:
    """``state`` with every tensor on ``device`` (tensors already there are not copied)."""
    return {name: t.to(device) for name, t in state.items()}


_NBYTES = attrgetter("nbytes")


def tensor_bytes(tensors: Mapping[str, Tensor]) -> int:
    """Bytes needed to send ``tensors`` uncompressed."""
    return sum(map(_NBYTES, tensors.values()))  # no generator frame per tensor: this runs once per client


def all_finite(tensors: Mapping[str, Tensor]) -> bool:
    """Whether every floating-point tensor is free of NaN and Inf (one device sync).

    Checks each tensor's smallest and largest value (one ``aminmax`` each, which NaN and Inf reach): ~7x cheaper
    than ``isfinite(t).all()`` per tensor, and without the copy that ``abs()`` before ``amax()`` makes; the extremes
    are read as Python floats (:func:`~fl_lightning.utils.scalars.read_scalars`; ``torch.isfinite`` is four kernels).
    Neither a ``no_grad`` context nor ``detach`` (a parameter's extremes record graph nodes, freed at once): it runs
    once per client, where each call counts (``benchmarks/results/executor_pace.md``; a concatenated copy of a small
    state screened at once was slower).
    """
    extremes = [bound for t in tensors.values() if t.is_floating_point() and t.numel() for bound in torch.aminmax(t)]
    return all(map(math.isfinite, read_scalars(extremes)))
