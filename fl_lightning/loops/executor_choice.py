"""Which :class:`~fl_lightning.loops.client_executor.ClientExecutor` runs the clients (:func:`make_executor`);
``client_executor="auto"``: the lean executor whenever it gives the Lightning executor's weights.

The lean executor (:class:`~fl_lightning.loops.lean_executor.LeanExecutor`) calls
``training_step``, ``backward`` and ``optimizer.step`` directly. It gives the same weights bit
for bit as Lightning's epoch loop unless something it skips would act during the client's steps:
a per-batch hook of the module, the datamodule or a callback, manual or multiple optimizers,
gradient clipping or accumulation, gradient scaling,
or ``self.log(..., on_step=True)``. The first are read from the trainer before the fit
(:func:`~fl_lightning.loops.skipped_features.skipped_step_features`); per-step logging is only
known once a client has trained, so ``auto`` trains the run's first client with Lightning's
epoch loop and decides then (:func:`~fl_lightning._lightning_compat.on_step_metric_names`). ``auto`` never picks the batched
executor, whose weights equal the others' only to float rounding.
"""

from __future__ import annotations

from collections.abc import Sized

import lightning.pytorch as pl
from lightning.pytorch.utilities.rank_zero import rank_zero_info

from typing_extensions import override

from fl_lightning import _lightning_compat as compat
from fl_lightning.loops.batched_exactness import check_parameter_references
from fl_lightning.loops.batched_executor import (
    BatchedExecutor,
    check_batched_support,
    check_compiled_batch_norm,
    check_compiled_holders,
    warn_rounding,
)
from fl_lightning.loops.client_executor import ClientExecutor, ClientRuntime, SequentialExecutor
from fl_lightning.loops.lean_executor import LeanExecutor
from fl_lightning.loops.lightning_executor import LightningExecutor
from fl_lightning.loops.optimizer_checks import check_optimizers, closure_optimizers
from fl_lightning.loops.skipped_features import skipped_step_features, warn_skipped


def auto_choice_before_fit(trainer: pl.Trainer) -> str | None:
    """``"lightning"`` (and says why, once) if the trainer rules the lean executor out, else
    ``None``: the decision waits for the first client (:func:`auto_choice_after_first_client`)."""
    blockers = skipped_step_features(trainer)
    if not blockers:
        return None
    rank_zero_info(f"client_executor='auto' runs clients through Lightning's epoch loop: {', '.join(blockers)}.")
    return "lightning"


def auto_choice_after_first_client(trainer: pl.Trainer) -> str:
    """``"lean"`` unless the first client logged per-step metrics, which only Lightning's loop logs; says which, once."""
    on_step = compat.on_step_metric_names(trainer)
    if on_step:
        rank_zero_info(f"client_executor='auto' runs clients through Lightning's epoch loop: on_step logging of {on_step}.")
        return "lightning"
    rank_zero_info(
        "client_executor='auto' runs clients with the lean executor (the same weights as Lightning's epoch loop, "
        "without its per-step machinery); pass client_executor='lightning' to keep every per-step hook."
    )
    return "lean"


class AutoExecutor(SequentialExecutor):
    """``"auto"`` once the trainer allows the lean executor: the run's first client trains through
    Lightning's epoch loop, which shows whether the module logs per step; the rest through the
    executor :func:`auto_choice_after_first_client` picks (decided before the first client's
    ``client_update``, which may itself train clients, as FedEM's does)."""

    name = "auto"

    def __init__(self, runtime: ClientRuntime) -> None:
        super().__init__(runtime)
        self.choice: SequentialExecutor | None = None

    @property
    @override
    def chosen(self) -> str | None:
        return None if self.choice is None else self.choice.name

    @override
    def run_steps(self, batches: Sized) -> int:
        if self.choice is not None:
            return self.choice.run_steps(batches)
        steps = LightningExecutor(self.runtime).run_steps(batches)
        chosen = auto_choice_after_first_client(self.runtime.trainer)
        self.choice = LeanExecutor(self.runtime) if chosen == "lean" else LightningExecutor(self.runtime)
        return steps


def make_executor(
    client_executor: str, runtime: ClientRuntime, *, max_batched_clients: int | None = None, compile_backend: str | None = None
) -> ClientExecutor:
    """The executor ``client_executor`` names; for ``"auto"``, Lightning's when the trainer rules
    the lean executor out (:func:`auto_choice_before_fit`), else :class:`AutoExecutor`. Refuses optimizers and
    schedulers no executor can train with (:func:`~fl_lightning.loops.optimizer_checks.check_optimizers`), and a
    closure-based optimizer (``LBFGS``) under an executor that calls ``optimizer.step()`` itself."""
    check_optimizers(runtime.trainer)
    closures = closure_optimizers(runtime.trainer)
    if closures and client_executor in ("lean", "batched"):
        raise ValueError(
            f"client_executor={client_executor!r} calls optimizer.step() without a closure, which {', '.join(closures)} "
            "needs: use client_executor='lightning' (or 'auto', which picks it)."
        )
    if client_executor == "auto":
        return AutoExecutor(runtime) if auto_choice_before_fit(runtime.trainer) is None else LightningExecutor(runtime)
    if client_executor == "batched":
        check_batched_support(runtime)  # refused when the fit starts, not in its first round
        check_compiled_holders(runtime.module, compile_backend)
        check_compiled_batch_norm(runtime.module, compile_backend)
        check_parameter_references(runtime.module)
        warn_skipped("batched", skipped_step_features(runtime.trainer))
        warn_rounding(runtime.trainer)
        return BatchedExecutor(runtime, max_clients=max_batched_clients, compile_backend=compile_backend)
    sequential = {"lightning": LightningExecutor, "lean": LeanExecutor}
    if client_executor not in sequential:
        raise ValueError(f"`client_executor` must be 'auto', 'lightning', 'lean' or 'batched', got {client_executor!r}.")
    if client_executor == "lean":
        warn_skipped("lean", skipped_step_features(runtime.trainer))
    return sequential[client_executor](runtime)
