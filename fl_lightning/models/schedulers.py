"""Learning-rate schedulers under federation: the papers' schedules (ordinary ``torch`` schedulers stepped
once per round) and :class:`RoundStepSchedules`, which gives step-interval schedulers a per-round meaning."""

from __future__ import annotations

from collections.abc import Callable
from functools import cached_property
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


class RoundStepSchedules:
    """``interval="step"`` LR schedulers across clients and rounds: every client of round ``r`` trains with
    the schedule from the round's start, so at its local step ``k`` it sees the LR of schedule step
    ``r * steps_per_round + k``, whatever order the clients train in and on however many processes; at the
    end of the round the schedule moves on by ``steps_per_round`` steps (``trainer.estimated_stepping_batches``
    is then ``rounds * steps_per_round``: one client's schedule over the whole fit, so a cosine sized by it
    reaches its end at the last step of the last round, never before). ``interval="epoch"`` schedulers step
    once per round, after aggregation (:func:`~fl_lightning._lightning_compat.step_epoch_schedulers`).

    Args:
        trainer: the trainer whose ``lr_scheduler_configs`` and optimizers are managed.
        steps_per_round: the most optimizer steps a client takes in a round; called once, and only with a
            step-interval scheduler (it reads every client's batch count).
        first_round: the round whose start the schedulers' current state is (the rounds a checkpoint holds).
    """

    def __init__(self, trainer: pl.Trainer, steps_per_round: Callable[[], int], first_round: int) -> None:
        self.trainer = trainer
        self._steps_per_round = steps_per_round
        self._configs = [c for c in trainer.lr_scheduler_configs if c.interval == "step" and not c.reduce_on_plateau]
        self._round = first_round
        self._start = self._state()

    def _state(self) -> list[tuple[dict[str, Any], list[float]]]:
        return [(c.scheduler.state_dict(), [g["lr"] for g in c.scheduler.optimizer.param_groups]) for c in self._configs]

    def _restore(self) -> None:
        for config, (state, lrs) in zip(self._configs, self._start):
            config.scheduler.load_state_dict(state)
            for group, lr in zip(config.scheduler.optimizer.param_groups, lrs):
                group["lr"] = lr

    def start_client(self, round_idx: int) -> None:
        """Puts the schedulers at round ``round_idx``'s start, so the client's local steps follow the same LR
        sequence as every other client's of that round (an asynchronous client may start the next round's)."""
        if self._configs:
            self._move_to(round_idx)
            self._restore()

    def end_round(self, round_idx: int) -> None:
        """Leaves the schedulers at the next round's start: the state a round-end checkpoint saves."""
        if self._configs:
            self._move_to(round_idx + 1)
            self._restore()

    @cached_property
    def steps_per_round(self) -> int:
        """The schedule steps of one round."""
        return self._steps_per_round()

    def _move_to(self, round_idx: int) -> None:
        """Moves the round's start on, a round at a time, through the module's ``lr_scheduler_step``."""
        module = self.trainer.lightning_module
        while self._round < round_idx:
            self._restore()
            for config in self._configs:
                for step in range(1, self.steps_per_round + 1):
                    if step % config.frequency == 0:
                        module.lr_scheduler_step(config.scheduler, None)
            self._start, self._round = self._state(), self._round + 1
