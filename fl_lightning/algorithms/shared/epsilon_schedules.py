r"""Schedules for FedALIGN's alignment threshold :math:`\epsilon_t` (Ravi & Shomorony, §3.2).

The paper allows :math:`\epsilon_t` to shrink in later rounds (less bias) but gives no
formula and used a constant 0.2 in its experiments; the decays here are ours.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from fl_lightning.utils.init_args import RecordsInitArgs
from fl_lightning.utils.checks import check_integer


def check_epsilon(name: str, value: float) -> None:
    """Raises ``ValueError`` naming ``name`` unless ``value`` is an :math:`\\epsilon` (``>= 0``, ``inf`` allowed)."""
    if not value >= 0:  # also rejects NaN
        raise ValueError(f"`{name}` must be >= 0 (inf allowed), got {value}.")


class EpsilonSchedule(RecordsInitArgs, ABC):
    """:math:`\\epsilon_t` as a function of the round."""

    @abstractmethod
    def __call__(self, round_idx: int) -> float:
        """The threshold at ``round_idx``."""


class ConstantEpsilon(EpsilonSchedule):
    """:math:`\\epsilon_t = \\epsilon` (the paper's experiments: 0.2, or 0.4 for high noise)."""

    def __init__(self, value: float = 0.2) -> None:
        check_epsilon("value", value)
        self.value = value

    def __call__(self, round_idx: int) -> float:
        return self.value


class LinearEpsilon(EpsilonSchedule):
    """Linear decay from ``start`` to ``end`` between rounds ``begin`` and ``finish``, constant outside."""

    def __init__(self, *, start: float = 0.2, end: float = 0.0, begin: int = 0, finish: int = 100) -> None:
        check_epsilon("start", start)
        check_epsilon("end", end)
        check_integer("begin", begin, minimum=0)
        check_integer("finish", finish, minimum=begin + 1)
        self.start, self.end, self.begin, self.finish = start, end, begin, finish

    def __call__(self, round_idx: int) -> float:
        fraction = min(max((round_idx - self.begin) / (self.finish - self.begin), 0.0), 1.0)
        return self.start + fraction * (self.end - self.start)


class StepEpsilon(EpsilonSchedule):
    """:math:`\\epsilon_t = \\epsilon_0 \\cdot \\gamma^{\\lfloor t / k \\rfloor}`: multiplied by ``factor`` every ``every`` rounds."""

    def __init__(self, *, start: float = 0.2, factor: float = 0.5, every: int = 50) -> None:
        check_epsilon("start", start)
        if not 0 <= factor <= 1:
            raise ValueError(f"`factor` must be in [0, 1], got {factor}.")
        check_integer("every", every, minimum=1)
        self.start, self.factor, self.every = start, factor, every

    def __call__(self, round_idx: int) -> float:
        scale = self.factor ** (round_idx // self.every)
        return 0.0 if scale == 0 else self.start * scale  # inf * 0 would be NaN
