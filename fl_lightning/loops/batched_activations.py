"""The bytes one client's step produces in ``training_step``'s forward, measured in the batched executor's first step.

A group's activations grow with its clients: ``K`` clients of a step whose forward produces ``A`` bytes each hold
about ``K * A`` bytes of activations and temporaries at once. :class:`ForwardBytes` sums ``A`` from the outputs of
every torch function ``training_step`` calls while the first step runs (under ``vmap`` each output has one
client's logical shape), so the default group size can count activations beside the stacked weights
(:func:`~fl_lightning.loops.batched_group_size.group_size`) without running any of the user's code again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import Tensor
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves


class ForwardBytes(TorchFunctionMode):
    """Within the block, sums the bytes of every tensor that a torch function or tensor method returns (a call made
    inside one already counted is not seen: a handled function runs with the mode off, so nothing counts twice)."""

    def __init__(self) -> None:
        super().__init__()
        self.bytes = 0

    def __torch_function__(self, func: Callable[..., Any], types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        self.bytes += sum(t.numel() * t.element_size() for t in tree_leaves(out) if isinstance(t, Tensor))
        return out
