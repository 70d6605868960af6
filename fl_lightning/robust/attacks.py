"""What a malicious client does: poison its training data or its update.

Model poisoning follows the usual baselines: sign flipping and scaled updates (the "boosting"
of Bhagoji et al. 2019, "Analyzing Federated Learning through an Adversarial Lens", §3) and
Gaussian Byzantine updates (Blanchard et al. 2017, §5); data poisoning flips labels
(Tolpegin et al. 2020, "Data Poisoning Attacks Against Federated Learning Systems", §3).
"""

from __future__ import annotations

from typing import Any

import torch
from typing_extensions import override

from fl_lightning.model_state import State
from fl_lightning.update_bounds import positive_finite
from fl_lightning.utils.init_args import RecordsInitArgs


class Attack(RecordsInitArgs):
    """A malicious client's behaviour; by default honest (both hooks return their input)."""

    def poison_batch(self, batch: Any) -> Any:
        """A training batch as the malicious client uses it."""
        return batch

    def poison_update(self, delta: State, generator: torch.Generator) -> State:
        """The delta the malicious client sends instead of ``delta`` (``generator``: its seeded source)."""
        return delta

    @property
    def poisons_data(self) -> bool:
        """Whether :meth:`poison_batch` is overridden (the client's data is then wrapped)."""
        return type(self).poison_batch is not Attack.poison_batch

    @property
    def poisons_update(self) -> bool:
        """Whether :meth:`poison_update` is overridden (model poisoning)."""
        return type(self).poison_update is not Attack.poison_update


class LabelFlip(Attack):
    """Trains on flipped labels :math:`y \\mapsto C - 1 - y` (Tolpegin et al. 2020, §3); batches are ``(x, y, ...)``.

    Args:
        num_classes: :math:`C \\ge 2`.
    """

    def __init__(self, *, num_classes: int) -> None:
        if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 2:
            raise ValueError(f"`num_classes` must be an integer >= 2, got {num_classes!r}.")
        self.num_classes = num_classes

    @override
    def poison_batch(self, batch: Any) -> Any:
        inputs, labels, *rest = batch
        return (inputs, self.num_classes - 1 - labels, *rest)


class SignFlip(Attack):
    """Sends :math:`-s\\,\\Delta`, the honest delta reversed (and scaled by ``scale``).

    Args:
        scale: :math:`s > 0`.
    """

    def __init__(self, *, scale: float = 1.0) -> None:
        self.scale = positive_finite("scale", scale)

    @override
    def poison_update(self, delta: State, generator: torch.Generator) -> State:
        return {n: t * -self.scale if t.is_floating_point() else t for n, t in delta.items()}


class ScaledUpdate(Attack):
    """Sends :math:`s\\,\\Delta`, the honest delta boosted (Bhagoji et al. 2019, §3).

    Args:
        scale: :math:`s > 0`.
    """

    def __init__(self, *, scale: float = 10.0) -> None:
        self.scale = positive_finite("scale", scale)

    @override
    def poison_update(self, delta: State, generator: torch.Generator) -> State:
        return {n: t * self.scale if t.is_floating_point() else t for n, t in delta.items()}


class GaussianUpdate(Attack):
    """Sends :math:`\\mathcal N(0, \\sigma^2 I)` instead of its delta (Blanchard et al. 2017, §5).

    Args:
        std: :math:`\\sigma > 0`.
    """

    def __init__(self, *, std: float = 1.0) -> None:
        self.std = positive_finite("std", std)

    @override
    def poison_update(self, delta: State, generator: torch.Generator) -> State:
        return {
            n: (torch.randn(t.shape, generator=generator) * self.std).to(t) if t.is_floating_point() else t
            for n, t in delta.items()
        }
