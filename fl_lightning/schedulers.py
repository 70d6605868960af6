"""Learning-rate schedules of the papers, as ordinary ``torch`` schedulers stepped once per round."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler


class StaircaseLR(LRScheduler):
    r"""The staircase rate :math:`\eta_\tau = \eta_0 / (\tau - \tau_{shift})` of Ruan et al. 2021 (§3.3, §5):
    constant within a round, decaying across rounds, restarted at an objective shift.

    Stepped once per round (Lightning ``interval="epoch"``; one epoch is one round). Rounds count
    from 1 after each shift, so round ``r`` (0-based) with the last shift at round ``s`` uses
    :math:`\eta_0 / (r - s + 1)`: the paper's formula without its division by zero at
    :math:`\tau = \tau_0` (notes §2.4).

    Args:
        optimizer: the wrapped optimizer.
        last_epoch: as ``torch``'s schedulers.
        restart: the share of the rounds since the last shift that a restart forgets: 1 (default)
            is the paper's restart to :math:`\eta_0` (Corollary 3.2.1), 0 keeps the rate going,
            0.5 moves the shift half-way, so the rate only about doubles. The paper states 1; the
            other values measure how much its Tables 4-5 depend on it.
    """

    def __init__(self, optimizer: Optimizer, last_epoch: int = -1, restart: float = 1.0) -> None:
        if not 0.0 <= restart <= 1.0:
            raise ValueError(f"`restart` must be in [0, 1] (the share of the rounds since the last shift to forget), got {restart!r}.")
        self.shift, self.restart_share = 0.0, restart
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        return [base / (self.last_epoch - self.shift + 1) for base in self.base_lrs]

    def restart(self, round_idx: int) -> None:
        """Objective shift at ``round_idx`` (an arrival or an excluded departure): back to :math:`\\eta_0`
        with ``restart=1``, the given share of the way with less."""
        self.shift += self.restart_share * (round_idx - self.shift)
        self._last_lr = self.get_lr()
        for group, lr in zip(self.optimizer.param_groups, self._last_lr):
            group["lr"] = lr


def restart_staircases(trainer: pl.Trainer, round_idx: int) -> int:
    """Restarts every :class:`StaircaseLR` of the trainer at ``round_idx``; returns how many."""
    staircases: list[Any] = [c.scheduler for c in trainer.lr_scheduler_configs if isinstance(c.scheduler, StaircaseLR)]
    for scheduler in staircases:
        scheduler.restart(round_idx)
    return len(staircases)
