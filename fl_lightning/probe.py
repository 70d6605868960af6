"""Loss probes: the global model's loss on a client's data, without training.

FedALIGN compares clients' losses with the priority loss; FedSoft and IFCA assign samples to
the cluster centre with the lowest loss. Both use :func:`probe`, a no-grad, eval-mode pass
that leaves BatchNorm statistics and the module's training mode as they were.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import lightning.pytorch as pl
import torch
from lightning.fabric.utilities.apply_func import move_data_to_device
from torch import Tensor


@runtime_checkable
class SupportsSampleMetrics(Protocol):
    """A module that scores every sample of a batch.

    ``sample_metrics(batch)`` returns ``{"loss": Tensor[B]}`` and optionally ``"correct"``
    (``Tensor[B]`` of 0/1). :class:`~fl_lightning.models.ClassificationModule` implements it.
    """

    def sample_metrics(self, batch: Any) -> dict[str, Tensor]: ...


@dataclass(frozen=True)
class ProbeResult:
    """Mean loss (and accuracy, when the module reports ``correct``) over ``num_samples`` samples."""

    loss: float
    accuracy: float | None
    num_samples: int


def _check(module: pl.LightningModule) -> None:
    if not isinstance(module, SupportsSampleMetrics):
        raise TypeError(
            f"{type(module).__name__} cannot be probed: implement `sample_metrics(batch) -> "
            "{'loss': Tensor[B], 'correct': Tensor[B] (optional)}` (ClassificationModule does)."
        )


@torch.no_grad()
def sample_metrics(module: pl.LightningModule, batches: Iterable[Any]) -> dict[str, Tensor]:
    """Per-sample metrics of ``module`` over ``batches``, concatenated, in eval mode."""
    _check(module)
    modes = {m: m.training for m in module.modules()}
    module.eval()
    try:
        parts: dict[str, list[Tensor]] = {}
        for batch in batches:
            for key, value in module.sample_metrics(move_data_to_device(batch, module.device)).items():  # type: ignore[attr-defined]
                parts.setdefault(key, []).append(value.detach().float())
        return {key: torch.cat(values) for key, values in parts.items()}
    finally:
        for m, training in modes.items():
            m.training = training


def probe(module: pl.LightningModule, batches: Iterable[Any]) -> ProbeResult:
    """Mean loss and accuracy of ``module`` over ``batches`` (one device sync)."""
    metrics = sample_metrics(module, batches)
    if "loss" not in metrics:
        raise ValueError("Probing found no samples: the client has no data.")
    losses = metrics["loss"]
    correct = metrics.get("correct")
    accuracy = None if correct is None else float(correct.mean())
    return ProbeResult(loss=float(losses.mean()), accuracy=accuracy, num_samples=len(losses))
