"""What Lightning's epoch loop runs around each training step that the direct executors (lean, batched) skip.

:func:`skipped_step_features` reads it from the trainer before the fit; ``client_executor="auto"``
then keeps Lightning's loop, and an explicitly chosen lean or batched executor warns once
(:func:`warn_skipped`), since nothing else would show that a hook never ran.
"""

from __future__ import annotations

from collections.abc import Sequence

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.model_helpers import is_overridden
from lightning.pytorch.utilities.rank_zero import rank_zero_warn

from fl_lightning import _lightning_compat as compat
from fl_lightning.callbacks.client_loss import ClientLossRecorder
from fl_lightning.loops.optimizer_checks import closure_optimizers

#: Hooks Lightning calls around every training step, on the module and on callbacks.
STEP_HOOKS = (
    "on_train_batch_start",
    "on_train_batch_end",
    "on_before_backward",
    "on_after_backward",
    "on_before_optimizer_step",
    "on_before_zero_grad",
)
#: Module methods through which Lightning runs a step, which the direct executors do not call.
MODULE_STEP_METHODS = (
    "backward", "optimizer_step", "optimizer_zero_grad", "configure_gradient_clipping", "clip_gradients", "lr_scheduler_step"
)


def skipped_step_features(trainer: pl.Trainer) -> list[str]:
    """Why an executor that calls ``training_step``, ``backward`` and ``optimizer.step`` itself could
    differ from Lightning's epoch loop on this trainer (empty: it cannot)."""
    module = trainer.lightning_module
    reasons = []
    if not module.automatic_optimization:
        reasons.append("manual optimization")
    if len(trainer.optimizers) != 1:
        reasons.append(f"{len(trainer.optimizers)} optimizers")
    if trainer.gradient_clip_val:
        reasons.append(f"gradient clipping (gradient_clip_val={trainer.gradient_clip_val})")
    if trainer.accumulate_grad_batches != 1:
        reasons.append(f"gradient accumulation (accumulate_grad_batches={trainer.accumulate_grad_batches})")
    reasons += [f"a closure-based optimizer ({name}.step needs a closure)" for name in closure_optimizers(trainer)]
    if getattr(trainer.precision_plugin, "scaler", None) is not None:
        reasons.append(f"gradient scaling (precision={trainer.precision!r})")
    reasons += [f"{type(module).__name__}.{hook}" for hook in (*STEP_HOOKS, *MODULE_STEP_METHODS) if is_overridden(hook, module)]
    reasons += compat.overridden_batch_hooks(trainer, compat.BATCH_TRANSFER_HOOKS[:1])
    for callback in trainer.callbacks:  # type: ignore[attr-defined]
        if isinstance(callback, ClientLossRecorder) or compat.acts_only_at_epoch_ends(callback):
            continue  # the direct executors report losses to the recorder themselves
        reasons += [f"{type(callback).__name__}.{hook}" for hook in STEP_HOOKS if is_overridden(hook, callback, Callback)]
    return reasons


def warn_skipped(executor: str, features: Sequence[str]) -> None:
    """Says once, naming each, that an explicitly chosen ``executor`` never runs ``features``."""
    if features:
        rank_zero_warn(
            f"client_executor={executor!r} skips {', '.join(features)}, which Lightning's epoch loop would run; "
            "pass client_executor='lightning' (or 'auto', which then picks it) to keep them."
        )
