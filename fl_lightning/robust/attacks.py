"""What a malicious client does: poison its training data or its update.

Model poisoning follows the usual baselines: sign flipping, scaled updates (the explicit boosting
of Bhagoji et al. 2019, "Analyzing Federated Learning through an Adversarial Lens", §3, applied to
the honest delta) and Gaussian Byzantine updates (Blanchard et al. 2017, §5); data poisoning flips
labels, every label :math:`y \\mapsto C - 1 - y` (the label-flipping attack of Fang et al. 2020, "Local
Model Poisoning Attacks to Byzantine-Robust Federated Learning") or one source class to one target
(Tolpegin et al. 2020, "Data Poisoning Attacks Against Federated Learning Systems", §3).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from typing_extensions import override

from fl_lightning.server.model_state import State
from fl_lightning.robust.update_bounds import positive_finite
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


#: Keys a dict batch's labels are looked up under when ``label_key`` is not given, in this order.
LABEL_KEYS = ("label", "labels", "y", "target", "targets")


class LabelFlip(Attack):
    """Trains on flipped labels: every label :math:`y \\mapsto C - 1 - y` (Fang et al. 2020), or with
    ``source`` and ``target`` only that class, :math:`s \\mapsto t` (Tolpegin et al. 2020, §3).

    Batches are tuples or lists ``(x, y, ...)`` or dicts holding the labels under ``label_key`` (by
    default the first of :data:`LABEL_KEYS` present); labels are integer tensors of any shape, and
    values outside ``[0, C)`` (a padding or ignore index such as -100) are left as they are.

    Args:
        num_classes: :math:`C \\ge 2`.
        source: the class to flip (with ``target``); ``None`` flips every class.
        target: the class ``source`` becomes.
        label_key: the key of a dict batch's labels.
    """

    def __init__(
        self, *, num_classes: int, source: int | None = None, target: int | None = None, label_key: str | None = None
    ) -> None:
        if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 2:
            raise ValueError(f"`num_classes` must be an integer >= 2, got {num_classes!r}.")
        if (source is None) != (target is None):
            raise ValueError(
                f"`source` and `target` go together (one class flipped to another), got source={source!r}, target={target!r}."
            )
        for name, value in (("source", source), ("target", target)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < num_classes):
                raise ValueError(f"`{name}` must be a class in 0..{num_classes - 1}, got {value!r}.")
        if source is not None and source == target:
            raise ValueError(f"`source` and `target` must differ, got {source!r} for both.")
        self.num_classes, self.source, self.target, self.label_key = num_classes, source, target, label_key

    def flip(self, labels: torch.Tensor) -> torch.Tensor:
        """``labels`` flipped; values outside ``[0, C)`` unchanged."""
        if not isinstance(labels, torch.Tensor) or labels.is_floating_point() or labels.is_complex():
            kind = f"{type(labels).__name__} {getattr(labels, 'dtype', '')}".rstrip()
            raise TypeError(f"LabelFlip flips integer class labels, got {kind}.")
        if self.source is not None:
            return torch.where(labels == self.source, torch.full_like(labels, self.target), labels)  # type: ignore[arg-type]
        valid = (labels >= 0) & (labels < self.num_classes)
        return torch.where(valid, self.num_classes - 1 - labels, labels)

    @override
    def poison_batch(self, batch: Any) -> Any:
        if isinstance(batch, Mapping):
            key = self.label_key if self.label_key is not None else next((k for k in LABEL_KEYS if k in batch), None)
            if key is None or key not in batch:
                looked = repr(self.label_key) if self.label_key is not None else f"any of {list(LABEL_KEYS)}"
                raise TypeError(
                    f"LabelFlip found no labels under {looked} in a dict batch with keys {list(batch)}: set `label_key`."
                )
            return {**batch, key: self.flip(batch[key])}
        if isinstance(batch, (tuple, list)) and len(batch) >= 2:
            inputs, labels, *rest = batch
            flipped = (inputs, self.flip(labels), *rest)
            return list(flipped) if isinstance(batch, list) else flipped
        raise TypeError(
            f"LabelFlip needs batches (x, y, ...) or dicts of tensors with a label key, got a {type(batch).__name__} batch."
        )


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
    """Sends :math:`s\\,\\Delta`, its honest delta scaled: the explicit boosting of Bhagoji et al. 2019, §3, which
    there scales an update trained on a malicious objective; here, with no such objective, a norm-inflation attack
    (a test of norm bounds and robust rules, not a targeted backdoor).

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
