"""Training-step outputs that keep the task loss and an added regulariser apart.

A mixin that adds a term to the loss (FedProx's proximal term, FedSoft's several centres)
still optimises their sum, but the federated loop reports the task loss as ``train_loss`` and
the added terms as ``train_regularizer``, so that FedProx's training loss is comparable with
FedAvg's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import Tensor

#: Key of the task loss (without the added terms) in a ``training_step`` output dict.
TASK_LOSS = "task_loss"
#: Key of the sum of the added terms in a ``training_step`` output dict.
REGULARIZER = "regularizer"


def add_regularizer(output: Tensor | Mapping[str, Any], term: Tensor) -> dict[str, Any]:
    """``output`` (a loss tensor or a dict with ``"loss"``) with ``term`` added to its loss.

    The result's ``"loss"`` is what the optimizer minimises; ``"task_loss"`` keeps the loss
    before any added term and ``"regularizer"`` the sum of the added terms (both detached), so
    several mixins compose.
    """
    fields = {"loss": output} if isinstance(output, Tensor) else dict(output)
    loss = fields["loss"]
    previous = fields.get(REGULARIZER)
    return {
        **fields,
        "loss": loss + term,
        TASK_LOSS: fields.get(TASK_LOSS, loss.detach()),
        REGULARIZER: term.detach() if previous is None else previous + term.detach(),
    }


def split_losses(output: Any) -> tuple[Tensor | None, Tensor | None]:
    """``(task loss, regularizer)`` of a ``training_step`` output; the regularizer is ``None``
    when nothing was added, the task loss ``None`` when the step returned no loss."""
    if isinstance(output, Tensor):
        return output, None
    if not isinstance(output, Mapping) or not isinstance(output.get("loss"), Tensor):
        return None, None
    return output.get(TASK_LOSS, output["loss"]), output.get(REGULARIZER)
