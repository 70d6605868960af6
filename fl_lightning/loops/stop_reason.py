"""How a federated fit ended, in words: the fit summary's "ended" row and the fit's last log line."""

from __future__ import annotations

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Timer
from lightning.pytorch.callbacks.early_stopping import EarlyStoppingReason


def stop_reason(trainer: pl.Trainer, rounds_done: int) -> str:
    """Why a fit that returned normally stopped after ``rounds_done`` rounds: the first limit that holds,
    in the order Lightning's fit loop checks them (``max_steps``, ``max_epochs``, then ``should_stop``), after
    ``fast_dev_run``, which sets ``max_steps``."""
    loop = trainer.fit_loop
    last = f"round {rounds_done - 1}" if rounds_done else "no round"
    if trainer.fast_dev_run:
        return f"fast_dev_run: one round of {int(trainer.fast_dev_run)} batch(es) per client, nothing written"
    if loop.max_steps != -1 and trainer.global_step >= loop.max_steps:
        return f"max_steps={loop.max_steps} reached in {last} (global step {trainer.global_step}); stopped at its end"
    if loop.max_epochs not in (None, -1) and rounds_done >= loop.max_epochs:
        return f"all max_epochs={loop.max_epochs} rounds done"
    timers = [c for c in trainer.callbacks if isinstance(c, Timer)]  # type: ignore[attr-defined]
    if any((left := t.time_remaining()) is not None and left <= 0 for t in timers):
        return f"time limit (max_time or a Timer) reached in {last}; stopped at its end"
    for callback in trainer.early_stopping_callbacks:
        if callback.stopping_reason != EarlyStoppingReason.NOT_STOPPED:
            return f"EarlyStopping on {callback.monitor!r} after {last} ({callback.stopping_reason.name.lower()})"
    if trainer.should_stop:
        return f"trainer.should_stop set (by a callback or the algorithm) in {last}"
    return f"stopped after {last}"


def failure_reason(error: BaseException, round_idx: int, rounds_done: int) -> str:
    """Why a fit ended with ``error`` raised in round ``round_idx`` after ``rounds_done`` aggregated rounds; the
    module then holds the global model of the last aggregated round (round ``round_idx`` itself when the error
    came after its aggregation, in its validation or logging).

    >>> print(failure_reason(ValueError("bad"), 3, 4))
    ValueError: bad in round 3, after its aggregation; the module holds the global model of round 3
    """
    held = f"the global model of round {rounds_done - 1}" if rounds_done else "the initial global model"
    what = "interrupted (KeyboardInterrupt)" if isinstance(error, KeyboardInterrupt) else f"{type(error).__name__}: {error}"
    when = f"round {round_idx}, after its aggregation" if rounds_done > round_idx else f"round {round_idx}"
    return f"{what} in {when}; the module holds {held}"
