"""Loss probes: the global model's loss on a client's data, without training.

FedALIGN compares clients' losses with the priority loss (:func:`probe`); FedSoft and IFCA
assign samples to the cluster centre with the lowest loss, scoring all centres in one pass
(:func:`sample_metrics_many`). Both are no-grad, eval-mode passes that leave BatchNorm
statistics and the module's training mode as they were.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import lightning.pytorch as pl
import torch
from lightning.fabric.utilities.apply_func import move_data_to_device
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from torch import Tensor, nn


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


def _on_module(batch: Any, module: pl.LightningModule) -> Any:
    """``batch`` on the module's device and, inside a fit, in its precision's input dtype (``64-true`` and
    ``16-true`` cast floating inputs as Lightning's own steps do; the mixed precisions leave them as they are)."""
    batch = move_data_to_device(batch, module.device)
    try:
        trainer = module.trainer
    except RuntimeError:  # a module probed outside a fit
        return batch
    return trainer.precision_plugin.convert_input(batch)


def _in_probe_dtype(value: Tensor) -> Tensor:
    """A per-sample metric in at least float32 (counts and half-precision losses are upcast), never below
    the module's own precision: a ``64-true`` run's losses stay float64 (issue 39: q-FedAvg's F_k)."""
    return value.to(torch.promote_types(value.dtype, torch.float32))


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
            for key, value in module.sample_metrics(_on_module(batch, module)).items():  # type: ignore[attr-defined]
                parts.setdefault(key, []).append(_in_probe_dtype(value.detach()))
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


class _Scorer(nn.Module):
    """``forward(batch) = module.sample_metrics(batch)``, so ``torch.func.functional_call`` can swap the weights."""

    def __init__(self, module: pl.LightningModule) -> None:
        super().__init__()
        self.module = module

    def forward(self, batch: Any) -> dict[str, Tensor]:
        return self.module.sample_metrics(batch)  # type: ignore[operator]


_VMAP_FAILED: set[type] = set()


class WeightSets:
    """``M`` weight sets ready for :func:`sample_metrics_many`: on the module's device and dtype,
    and stacked once for ``vmap``, so probing many clients with the same sets allocates nothing
    per client.

    Each state maps ``state_dict`` names to tensors (parameters and buffers; missing names keep
    the module's own).
    """

    def __init__(self, module: nn.Module, states: Sequence[Mapping[str, Tensor]]) -> None:
        if not states:
            raise ValueError("sample_metrics_many needs at least one weight set.")
        live = dict(module.state_dict(keep_vars=True))
        names = [n for n in states[0] if n in live]
        self.prepared = [
            {f"module.{n}": s[n].detach().to(device=live[n].device, dtype=live[n].dtype) for n in names} for s in states
        ]
        self._stacked: dict[str, Tensor] | None = None

    def __len__(self) -> int:
        return len(self.prepared)

    @property
    def stacked(self) -> dict[str, Tensor]:
        """The sets stacked along a new leading dimension (built on first use)."""
        if self._stacked is None:
            self._stacked = {k: torch.stack([p[k] for p in self.prepared]) for k in self.prepared[0]}
        return self._stacked


@torch.no_grad()
def sample_metrics_many(
    module: pl.LightningModule,
    states: Sequence[Mapping[str, Tensor]] | WeightSets,
    batches: Iterable[Any],
    *,
    batched: bool = True,
) -> dict[str, Tensor]:
    """Per-sample metrics of ``module`` under each of ``M`` weight sets, in one pass over ``batches``.

    ``states`` are state mappings or, to probe many clients with the same sets, a
    :class:`WeightSets` built once. With ``batched`` the ``M`` states are scored together with
    ``torch.func.vmap`` over ``torch.func.functional_call`` (one forward per batch for all
    states); a ``sample_metrics`` that ``vmap`` cannot trace (e.g. data-dependent control flow)
    falls back, with one warning, to ``M`` calls per batch. The module's own weights, its
    BatchNorm statistics and training mode are left as they were.

    Returns:
        ``{key: Tensor[M, num_samples]}`` on the module's device, e.g. ``"loss"`` and ``"correct"``.
    """
    _check(module)
    weights = states if isinstance(states, WeightSets) else WeightSets(module, states)
    prepared = weights.prepared
    scorer = _Scorer(module)
    use_vmap = batched and len(weights) > 1 and type(module) not in _VMAP_FAILED
    stacked = weights.stacked if use_vmap else {}
    modes = {m: m.training for m in module.modules()}
    module.eval()
    try:
        parts: dict[str, list[Tensor]] = {}
        for batch in batches:
            batch = _on_module(batch, module)
            out: dict[str, Tensor] | None = None
            if use_vmap:
                try:
                    out = torch.func.vmap(lambda w, b: torch.func.functional_call(scorer, w, (b,)), in_dims=(0, None))(
                        stacked, batch
                    )
                except RuntimeError as err:
                    _VMAP_FAILED.add(type(module))
                    use_vmap = False
                    rank_zero_warn(
                        f"{type(module).__name__}.sample_metrics cannot be vmapped ({err}); scoring the "
                        f"{len(weights)} weight sets one after the other."
                    )
            if out is None:
                per_state = [torch.func.functional_call(scorer, p, (batch,)) for p in prepared]
                out = {key: torch.stack([o[key] for o in per_state]) for key in per_state[0]}
            for key, value in out.items():
                parts.setdefault(key, []).append(_in_probe_dtype(value.detach()))
        if not parts:
            raise ValueError("Probing found no samples: the batches are empty.")
        return {key: torch.cat(values, dim=1) for key, values in parts.items()}
    finally:
        for m, training in modes.items():
            m.training = training
