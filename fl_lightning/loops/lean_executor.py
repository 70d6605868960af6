"""``client_executor="lean"``: ``training_step``, ``backward`` and ``optimizer.step`` called directly.

The same arithmetic as Lightning's automatic optimization, without its per-step hooks;
:mod:`~fl_lightning.loops.executor_choice` says when both give the same weights bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sized
from functools import cached_property
from typing import Any, NamedTuple

import lightning.pytorch as pl
from lightning.fabric.utilities.apply_func import move_data_to_device
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
import torch
from torch import Tensor
from torch.optim import Optimizer
from typing_extensions import override

from fl_lightning import _lightning_compat as compat
from fl_lightning.loops.client_executor import ClientRuntime, SequentialExecutor
from fl_lightning.mixins.applied_term import step_past_unset_terms


class LeanExecutor(SequentialExecutor):
    """Per batch: precision conversion, ``batch_to_device``, ``zero_grad``, ``training_step`` (in the
    precision plugin's context), ``backward``, ``optimizer.step``, ``interval="step"`` LR schedulers, and
    ``trainer.global_step`` one further, as in Lightning's loop (a step that returns ``None`` skips only the
    backward pass). ``self.log(on_epoch=True)`` still aggregates into the round; each step's output goes to
    the loss recorder."""

    name = "lean"

    def __init__(self, runtime: ClientRuntime) -> None:
        super().__init__(runtime)
        #: The per-step metrics already warned about, each named once.
        self._warned_metrics: set[str] = set()
        #: Each training step function's caller (:func:`~fl_lightning._lightning_compat.training_step_caller`).
        self._callers: dict[Callable[..., Any], Callable[[Any, int], Any]] = {}

    @cached_property
    def _steps(self) -> LeanSteps:
        """What every step uses, looked up once per fit (the trainer's module, optimizer, plugins and hooks
        do not change during the fit), after refusing what the lean executor cannot run."""
        trainer, optimizers = self.runtime.trainer, self.runtime.optimizers
        if not self.runtime.module.automatic_optimization or len(optimizers) != 1:
            raise ValueError("The lean client executor needs automatic optimization with exactly one optimizer.")
        if getattr(trainer.precision_plugin, "scaler", None) is not None:
            raise ValueError(f"The lean client executor does not scale gradients: precision={trainer.precision!r} is not supported.")
        return LeanSteps(
            optimizer=optimizers[0],
            prepare=batch_preparer(trainer),
            ready_on=None if needs_preparing(trainer) else trainer.strategy.root_device,
            start_batch=compat.batch_starter(trainer),
            count_step=compat.step_counter(trainer),
            schedulers=StepSchedulers(trainer) or None,
        )

    def _step_caller(self) -> Callable[[Any, int], Any]:
        """The client's ``training_step`` past the term mixins whose term it left unset (:func:`step_past_unset_terms`)."""
        step = step_past_unset_terms(self.runtime.module)
        key = getattr(step, "__func__", step)
        caller = self._callers.get(key)
        if caller is None:
            caller = self._callers[key] = compat.training_step_caller(self.runtime.trainer, step)
        return caller

    @override
    def run_steps(self, batches: Sized) -> int:
        optimizer, prepare, ready_on, start_batch, count_step, schedulers = self._steps
        call_step, record = self._step_caller(), self.runtime.recorder.record
        if ready_on is not None and getattr(batches, "device", None) == ready_on:
            prepare = None  # a ClientBatches stream already on the device: every batch would come back as it is
        steps = 0
        with compat.TrainingStepScope(self.runtime.module):
            for batch_idx, batch in enumerate(batches):  # type: ignore[call-overload]
                if prepare is not None:
                    batch = prepare(batch)
                start_batch(batch)
                optimizer.zero_grad(set_to_none=True)
                output = call_step(batch, batch_idx)
                # A tensor first: isinstance against the Mapping ABC is a Python call every step.
                loss = output if isinstance(output, Tensor) or not isinstance(output, Mapping) else output["loss"]
                # A step that returns None is still an optimizer step for Lightning: no backward, so no gradient
                # moves a weight, but the step, its LR schedulers and trainer.global_step all count it.
                if loss is not None:
                    loss.backward()
                    record(output)
                optimizer.step()
                if schedulers is not None:
                    schedulers.step(batch_idx)
                # Counted per step, as Lightning's loop does: the next training_step reads the new global_step.
                count_step(1)
                steps += 1
        self._warn_on_step_metrics()
        return steps

    def _warn_on_step_metrics(self) -> None:
        """Says once per metric that ``self.log(..., on_step=True)`` reached no logger: only Lightning's loop
        sends step values (read after each client, so a metric first logged in a later client is named too)."""
        logged = compat.on_step_metric_names(self.runtime.trainer)
        new = [name for name in logged if name not in self._warned_metrics]
        if new:
            self._warned_metrics.update(new)
            module = type(self.runtime.module).__name__
            rank_zero_warn(
                "The lean client executor (client_executor='lean', or 'auto' after a first client that logged no step "
                f"metric) does not send per-step metrics to the loggers: {module}.training_step logs "
                f"{', '.join(repr(n) for n in new)} with on_step=True, whose step values are skipped (on_epoch=True "
                "values still reach the round's row). Pass client_executor='lightning' to log every step."
            )


class LeanSteps(NamedTuple):
    """What the lean executor's steps use, resolved once per fit."""

    optimizer: Optimizer
    prepare: Callable[[Any], Any]
    #: The device whose tensors ``prepare`` returns as they are (``None``: it may change any batch).
    ready_on: torch.device | None
    start_batch: Callable[[Any], None]
    count_step: Callable[[int], None]
    schedulers: StepSchedulers | None


class StepSchedulers:
    """The trainer's ``interval="step"`` LR schedulers, stepped as Lightning's loop steps them: after each
    optimizer step, every ``frequency`` batches (the round's start is :class:`~fl_lightning.models.schedulers.RoundStepSchedules`')."""

    def __init__(self, trainer: pl.Trainer) -> None:
        self._module = trainer.lightning_module
        self._configs = [c for c in trainer.lr_scheduler_configs if c.interval == "step" and not c.reduce_on_plateau]

    def __bool__(self) -> bool:
        """Whether there is any to step."""
        return bool(self._configs)

    def step(self, batch_idx: int) -> None:
        """After the optimizer step of batch ``batch_idx`` (0-based)."""
        for config in self._configs:
            if (batch_idx + 1) % config.frequency == 0:
                self._module.lr_scheduler_step(config.scheduler, None)


def batch_preparer(trainer: pl.Trainer) -> Callable[[Any], Any]:
    """The precision plugin's ``convert_input``, then ``batch_to_device`` (:func:`batch_mover`)."""
    convert, move = trainer.precision_plugin.convert_input, batch_mover(trainer)
    if not converts_input(trainer):
        return move
    return lambda batch: move(convert(batch))


def converts_input(trainer: pl.Trainer) -> bool:
    """Whether the precision plugin's ``convert_input`` may change a batch (full precision's returns it as it is)."""
    return type(trainer.precision_plugin).convert_input is not pl.plugins.Precision.convert_input


def needs_preparing(trainer: pl.Trainer) -> bool:
    """Whether :func:`batch_preparer` may change a batch of tensors already on the device: a converting precision
    plugin, or batch transfer hooks the module or datamodule overrides."""
    return converts_input(trainer) or bool(compat.overridden_batch_hooks(trainer, compat.BATCH_TRANSFER_HOOKS[1:]))


def batch_mover(trainer: pl.Trainer) -> Callable[[Any], Any]:
    """``strategy.batch_to_device``, or, when neither module nor datamodule overrides its hooks,
    the ``move_data_to_device`` it would end in, without two hook dispatches per batch."""
    strategy = trainer.strategy
    if compat.overridden_batch_hooks(trainer, compat.BATCH_TRANSFER_HOOKS[1:]):
        return strategy.batch_to_device
    device = strategy.root_device

    def move(batch: Any) -> Any:
        # A tuple of tensors already there (every CPU run) is what move_data_to_device would return, 5 us sooner
        # (a loop, not all() over a generator: this runs every step).
        if type(batch) is tuple:
            for t in batch:
                if not (isinstance(t, Tensor) and t.device == device):
                    break
            else:
                return batch
        return move_data_to_device(batch, device)

    return move
