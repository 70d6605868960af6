"""Bounds on the L2 norm of client updates, applied by the server before aggregation.

Pass one to the trainer, ``FederatedTrainer(update_bound=NormClip(max_norm=10.0))``, or in YAML::

    trainer:
      update_bound:
        class_path: fl_lightning.MedianNormFilter
        init_args: {factor: 3.0}

The norm of an update is the L2 norm, in float64, over every floating-point tensor of its delta
``local - global`` (parameters and float buffers such as BatchNorm statistics); integer counters
are neither measured nor scaled. A compressed upload is measured after it is decoded
(:meth:`~fl_lightning.Algorithm.decode_update`). Algorithms whose uploads are not deltas
(FedSoft uploads whole models, FedPM masks) refuse a bound at set-up.
"""

from __future__ import annotations

import math
import statistics
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import ClassVar

import torch
from torch import Tensor

from fl_lightning.utils.init_args import RecordsInitArgs
from fl_lightning.server.model_state import State


def positive_finite(name: str, value: float, *, minimum: float = 0.0, inclusive: bool = False) -> float:
    """``value`` as a float, checked finite and ``> minimum`` (``>=`` with ``inclusive``); else a ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"`{name}` must be a number, got {value!r}.")
    too_small = value < minimum if inclusive else value <= minimum
    if too_small or not math.isfinite(value):
        bound = f">= {minimum}" if inclusive else f"> {minimum}"
        raise ValueError(f"`{name}` must be a finite number {bound}, got {value!r}.")
    return float(value)


class UpdateBound(RecordsInitArgs, ABC):
    """Decides, from the norms of a round's updates (or an asynchronous buffer's), how each is bounded."""

    #: Whether an update's fate depends on the other updates' norms; under client sharding the
    #: norms of every rank's updates are then gathered first (one extra small all-reduce).
    needs_all_norms: ClassVar[bool] = False

    @abstractmethod
    def scales(self, norms: Sequence[float]) -> list[float | None]:
        """Per update, the factor its delta is multiplied by (1.0 keeps it), or ``None`` to reject it."""


class NormClip(UpdateBound):
    r"""Scales every update whose norm exceeds ``max_norm`` down to norm ``max_norm``:
    :math:`\Delta_k \leftarrow \Delta_k \min(1, c / \lVert\Delta_k\rVert)`.

    Args:
        max_norm: :math:`c > 0`.
    """

    def __init__(self, *, max_norm: float) -> None:
        self.max_norm = positive_finite("max_norm", max_norm)

    def scales(self, norms: Sequence[float]) -> list[float | None]:
        return [min(1.0, self.max_norm / norm) if norm > 0 else 1.0 for norm in norms]


class MedianNormFilter(UpdateBound):
    r"""Rejects every update whose norm exceeds ``factor`` times the median norm of the round's
    (or the buffer's) non-zero updates; the others pass unchanged. Zero updates (a client that
    took no step) always pass and do not count towards the median.

    Args:
        factor: :math:`f \ge 1`: an update with :math:`\lVert\Delta_k\rVert > f \cdot \mathrm{median}` is rejected.
    """

    needs_all_norms: ClassVar[bool] = True

    def __init__(self, *, factor: float = 3.0) -> None:
        self.factor = positive_finite("factor", factor, minimum=1.0, inclusive=True)

    def scales(self, norms: Sequence[float]) -> list[float | None]:
        nonzero = [n for n in norms if n > 0]
        if not nonzero:
            return [1.0] * len(norms)
        limit = self.factor * statistics.median(nonzero)
        return [None if norm > limit else 1.0 for norm in norms]


def update_norm(delta: Mapping[str, Tensor]) -> float:
    """The L2 norm, in float64, over every floating-point tensor of ``delta`` (one device sync)."""
    norms = [torch.linalg.vector_norm(t.detach(), dtype=torch.float64) for t in delta.values() if t.is_floating_point()]
    if not norms:
        return 0.0
    return float(torch.linalg.vector_norm(torch.stack(norms)))


def scaled(delta: Mapping[str, Tensor], scale: float) -> State:
    """``delta`` with its floating-point tensors multiplied by ``scale`` (new tensors; integers as they are)."""
    return {name: t * scale if t.is_floating_point() else t for name, t in delta.items()}
