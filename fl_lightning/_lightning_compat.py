"""Every use of Lightning's protected internals, in one place.

``tests/test_lightning_compat.py`` is the contract test: it fails loudly when a Lightning
release changes one of the names or behaviours relied on here.
"""

from __future__ import annotations

from collections import OrderedDict
import importlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sized
from contextlib import contextmanager
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback, ModelCheckpoint, Timer
from lightning.pytorch.callbacks.timer import Interval
from lightning.pytorch.cli import _InstantiatorFn
from lightning.pytorch.core.mixins import HyperparametersMixin
import torch
from lightning.pytorch.loops.evaluation_loop import _EvaluationLoop
from lightning.pytorch.loops.fetchers import _DataFetcher
from lightning.pytorch.loops.fit_loop import _FitLoop
from lightning.pytorch.loops.loop import _Loop
from lightning.pytorch.loops.optimization.automatic import ClosureResult
from lightning.pytorch.loops.progress import _Progress
from lightning.pytorch.loops.training_epoch_loop import _TrainingEpochLoop
from lightning.pytorch.overrides.distributed import _sync_module_states
from lightning.pytorch.trainer import call
from lightning.pytorch.trainer.states import RunningStage, TrainerFn
from lightning.pytorch.utilities.combined_loader import CombinedLoader
from lightning.pytorch.utilities.model_helpers import is_overridden
from lightning.pytorch.utilities.signature_utils import is_param_in_hook_signature
from typing_extensions import override

from fl_lightning.utils._quiet import sync_dist_advice_silenced

__all__ = [
    "ClientEpochLoop",
    "FitLoopBase",
    "adopt_hparams",
    "give_cli_hparams_only_to_configured_classes",
    "count_steps",
    "call_epoch_start_hooks",
    "acts_only_at_epoch_ends",
    "clear_restarting",
    "epoch_end_log_step",
    "log_metrics",
    "on_step_metric_names",
    "overridden_batch_hooks",
    "reload_validation_data",
    "run_client_epoch",
    "batch_starter",
    "TrainingStepScope",
    "run_server_validation",
    "run_test_during_fit",
    "evaluation_metric_names",
    "step_epoch_schedulers",
    "step_takes_batch_idx",
    "step_counter",
    "training_step_caller",
    "set_completed_epochs",
    "sync_module_states",
]

#: Lightning only accepts fit loops of this class (its logger connector checks the type).
FitLoopBase = _FitLoop


class ServerValidationLoop(_EvaluationLoop):
    """Lightning's validation loop of a fit (the sanity check's too), over the global model.

    Lightning's advice to log its metrics with ``sync_dist=True`` is silenced while it runs:
    under federated DDP every rank evaluates the whole validation set, so each holds the same value.
    """

    @override
    def run(self) -> Any:
        with sync_dist_advice_silenced():
            return super().run()


class ClientEpochLoop(_TrainingEpochLoop):
    """Lightning's training-epoch loop, run once per client inside a round.

    It differs from Lightning's in four ways only:

    * a client always trains all its batches: ``max_steps``, ``max_time`` and ``trainer.should_stop``
      end the fit at the end of a round (:class:`~fl_lightning.loops.federated_fit_loop.FederatedFitLoop`),
      so the module is never left holding a client's half-trained weights;
    * no validation inside a client: the server evaluates the global model at round end;
    * ``interval="epoch"`` LR schedulers step once per round, not once per client;
    * no per-step SIGTERM broadcast across processes: ranks train different clients (and
      numbers of steps), so the flag travels in the round's all-reduce instead.

    The logging step stays Lightning's: optimizer steps over all clients, so per-step
    ``self.log`` honours ``log_every_n_steps``; round-level rows carry a ``round`` column.

    With ``returned_loss_key``, a step's output (what ``on_train_batch_end`` receives) also holds, under that
    key, the loss ``training_step`` returned, which Lightning's ``"loss"`` holds divided by
    ``accumulate_grad_batches`` (a value the step already gives under that key is kept).
    """

    in_client: bool = False

    def __init__(
        self, trainer: pl.Trainer, min_steps: int | None = None, max_steps: int = -1, *, returned_loss_key: str | None = None
    ) -> None:
        super().__init__(trainer, min_steps=min_steps, max_steps=max_steps)
        self.val_loop = ServerValidationLoop(trainer, TrainerFn.FITTING, RunningStage.VALIDATING, verbose=False, inference_mode=False)
        if returned_loss_key is not None:
            self.automatic_optimization.output_result_cls = _keeping_returned_loss(returned_loss_key)

    @property
    @override
    def done(self) -> bool:
        return self._num_ready_batches_reached() if self.in_client else super().done

    @override
    def _should_check_val_fx(self, data_fetcher: _DataFetcher) -> bool:
        return False

    @override
    def update_lr_schedulers(self, interval: str, update_plateau_schedulers: bool) -> None:
        if interval == "epoch" and self.in_client:
            return
        super().update_lr_schedulers(interval, update_plateau_schedulers)

    @override
    def _broadcast_sigterm_tensor(self) -> None:
        """Not per step: :class:`~fl_lightning.distributed.ClientSharding` carries the flag once per round."""

    @override
    def _num_ready_batches_reached(self) -> bool:
        # Outside a client (at round end) the round's "epoch" is always complete.
        return super()._num_ready_batches_reached() if self.in_client else True

    @override
    def _build_kwargs(self, kwargs: OrderedDict, batch: Any, batch_idx: int) -> OrderedDict:
        kwargs["batch"] = batch
        if step_takes_batch_idx(self.trainer.lightning_module):
            kwargs["batch_idx"] = batch_idx
        return kwargs


def _keeping_returned_loss(key: str) -> type[ClosureResult]:
    """Lightning's closure result, which divides the returned loss by ``accumulate_grad_batches`` for the
    backward pass, keeping the undivided loss under ``key`` too when it divides."""

    class KeepsReturnedLoss(ClosureResult):
        @classmethod
        @override
        def from_training_step_output(cls, training_step_output: Any, normalize: int = 1) -> ClosureResult:
            result = super().from_training_step_output(training_step_output, normalize)
            if normalize != 1 and result.loss is not None and key not in result.extra:
                returned = training_step_output if isinstance(training_step_output, torch.Tensor) else training_step_output["loss"]
                result.extra[key] = returned.detach()
            return result

    return KeepsReturnedLoss


_TAKES_BATCH_IDX: dict[Callable[..., Any], bool] = {}


def step_takes_batch_idx(module: pl.LightningModule) -> bool:
    """Whether ``module.training_step`` accepts ``batch_idx``; inspected once per function, not
    on every step (Lightning inspects the signature each time)."""
    return _takes_batch_idx(module.training_step)


def _takes_batch_idx(step: Callable[..., Any]) -> bool:
    key = getattr(step, "__func__", step)
    if key not in _TAKES_BATCH_IDX:
        _TAKES_BATCH_IDX[key] = is_param_in_hook_signature(step, "batch_idx", min_args=2)
    return _TAKES_BATCH_IDX[key]


def run_client_epoch(fit_loop: _FitLoop, batches: Sized) -> int:
    """Runs Lightning's epoch loop over one client's batch stream; returns the optimizer steps taken.

    Replaces ``setup_data()``, whose barrier and dataloader-length reduce must not run per
    client; the batches go through the usual precision conversion, ``batch_to_device`` and hooks.
    """
    # CombinedLoader reads a list, tuple or dict as several loaders: hand it one stream.
    combined = CombinedLoader(_OneStream(batches) if isinstance(batches, (list, tuple, Mapping)) else batches, "max_size_cycle")
    fetcher = _DataFetcher()
    fetcher.setup(combined)
    iter(fetcher)
    fit_loop._combined_loader = combined
    fit_loop._data_fetcher = fetcher
    fit_loop.max_batches = len(batches)  # type: ignore[arg-type]
    epoch_loop = fit_loop.epoch_loop
    assert isinstance(epoch_loop, ClientEpochLoop)
    epoch_loop.in_client = True
    steps_before = epoch_loop.global_step
    try:
        epoch_loop.run(fetcher)
    finally:
        epoch_loop.in_client = False
    return epoch_loop.global_step - steps_before


class _OneStream:
    """A sized iterable that :class:`CombinedLoader` takes as one loader, whatever it wraps."""

    def __init__(self, batches: Sized) -> None:
        self._batches = batches

    def __iter__(self) -> Iterator[Any]:
        return iter(self._batches)  # type: ignore[call-overload]

    def __len__(self) -> int:
        return len(self._batches)


class TrainingStepScope:
    """Runs ``training_step`` calls outside Lightning's epoch loop as that loop would: ``self.log``
    knows it is in ``training_step``; :func:`batch_starter` readies the logger for each batch.

    A class, not a generator-based context manager, and the name set with ``object.__setattr__`` (what
    ``nn.Module.__setattr__`` ends in for a plain attribute): it opens once per client of the lean executor.
    """

    def __init__(self, module: pl.LightningModule) -> None:
        self._module = module

    def __enter__(self) -> None:
        self._previous = self._module._current_fx_name
        object.__setattr__(self._module, "_current_fx_name", "training_step")

    def __exit__(self, *exc_info: object) -> None:
        object.__setattr__(self._module, "_current_fx_name", self._previous)


def batch_starter(trainer: pl.Trainer) -> Callable[[Any], None]:
    """What Lightning's logger connector does when a training batch starts (the batch size ``self.log`` infers),
    as a function of the batch, for a client's steps (the result collection looked up once, not per step)."""
    connector, results = trainer._logger_connector, trainer._results
    assert results is not None

    def start(batch: Any) -> None:  # LoggerConnector.on_batch_start, line for line
        connector._first_loop_iter = connector._first_loop_iter is None
        results.batch = batch
        results.batch_size = None
        results.dataloader_idx = None

    return start


def count_steps(trainer: pl.Trainer, steps: int) -> None:
    """Counts ``steps`` optimizer steps that ran outside Lightning's epoch loop (the lean and
    batched executors, other processes' clients) as that loop counts its own: in
    ``trainer.global_step`` and in the logging step, so both equal the Lightning executor's."""
    step_counter(trainer)(steps)


def step_counter(trainer: pl.Trainer) -> Callable[[int], None]:
    """:func:`count_steps` for ``trainer``, its counters looked up once (the lean executor counts after every step)."""
    epoch_loop = trainer.fit_loop.epoch_loop
    step = epoch_loop.automatic_optimization.optim_progress.optimizer.step
    total, current = step.total, step.current

    def count(steps: int) -> None:
        epoch_loop._batches_that_stepped += steps
        total.ready += steps
        total.completed += steps
        current.ready += steps
        current.completed += steps

    return count


def training_step_caller(trainer: pl.Trainer, step: Callable[..., Any]) -> Callable[[Any, int], Any]:
    """``step(batch, batch_idx)`` (or ``(batch)``, as its signature asks), the module's bound ``training_step`` or one
    past its unset term mixins, in the precision plugin's ``train_step_context``, as Lightning's loop calls
    ``training_step``; the context is left out where it is Lightning's empty one (full precision), which costs a
    generator per step and does nothing."""
    precision = trainer.precision_plugin
    call_step = step if _takes_batch_idx(step) else (lambda batch, batch_idx: step(batch))
    empty = (
        type(precision).train_step_context is pl.plugins.Precision.train_step_context
        and type(precision).forward_context is pl.plugins.Precision.forward_context
    )
    if empty:
        return call_step

    def in_context(batch: Any, batch_idx: int) -> Any:
        with precision.train_step_context():
            return call_step(batch, batch_idx)

    return in_context


def step_counters(trainer: pl.Trainer) -> tuple[int, int]:
    """``(optimizer steps, logging steps)``: ``trainer.global_step`` and the counter the logged
    ``step`` comes from (a checkpoint saved in ``on_train_batch_end`` holds the latter one behind)."""
    return trainer.global_step, trainer.fit_loop.epoch_loop._batches_that_stepped


def rewind_step_counters(trainer: pl.Trainer, counters: tuple[int, int]) -> None:
    """Sets both counters back to ``counters`` (from :func:`step_counters`), for a round replayed from its start."""
    global_step, logging_steps = counters
    count_steps(trainer, global_step - trainer.global_step)
    trainer.fit_loop.epoch_loop._batches_that_stepped = logging_steps


def acts_only_at_epoch_ends(callback: Callback) -> bool:
    """Whether ``callback`` overrides ``on_train_batch_end`` but never acts there: a ``ModelCheckpoint``
    without a step or time trigger, or a ``Timer(interval="epoch")`` (what ``max_time`` becomes)."""
    if isinstance(callback, Timer):
        return callback._interval == Interval.epoch
    return isinstance(callback, ModelCheckpoint) and not callback._every_n_train_steps and callback._train_time_interval is None


def on_step_metric_names(trainer: pl.Trainer) -> list[str]:
    """The names logged with ``self.log(..., on_step=True)`` during training since the epoch began."""
    return list(dict.fromkeys(m.meta.name for m in trainer.fit_loop.epoch_loop._results.values() if m.meta.on_step))


#: The LightningModule/LightningDataModule hooks a batch passes through on its way to the device.
BATCH_TRANSFER_HOOKS = ("on_before_batch_transfer", "transfer_batch_to_device", "on_after_batch_transfer")


def overridden_batch_hooks(trainer: pl.Trainer, hooks: Iterable[str] = BATCH_TRANSFER_HOOKS) -> list[str]:
    """``Owner.hook`` for each of ``hooks`` that the module or the datamodule overrides."""
    owners = [trainer.lightning_module] + [trainer.datamodule] * isinstance(trainer.datamodule, pl.LightningDataModule)
    return [f"{type(owner).__name__}.{hook}" for owner in owners for hook in hooks if is_overridden(hook, owner)]


def sync_module_states(module: torch.nn.Module) -> None:
    """Broadcasts rank 0's parameters and buffers to every process of the default process group."""
    _sync_module_states(module)


def set_completed_epochs(progress: _Progress, count: int) -> None:
    """Marks ``count`` epochs (rounds) as fully done, with none in flight."""
    for tracker in (progress.total, progress.current):
        tracker.ready = tracker.started = tracker.processed = tracker.completed = count


def clear_restarting(loop: _Loop) -> None:
    """Clears the ``restarting`` flag of ``loop`` and its child loops."""
    _Loop.restarting.fset(loop, False)  # type: ignore[attr-defined]


def log_metrics(trainer: pl.Trainer, metrics: Mapping[str, float], step: int) -> None:
    """Logs loop-level metrics to every logger, also exposing them to callbacks (``callback_metrics``)."""
    trainer._logger_connector.log_metrics(dict(metrics), step=step)
    # One tensor for the round's values, its 0-d views the metrics (a tensor each, as Lightning keeps them).
    values = torch.tensor([float(v) for v in metrics.values()], dtype=torch.get_default_dtype()).unbind()
    trainer._logger_connector._callback_metrics.update(zip(metrics, values))


def epoch_end_log_step(trainer: pl.Trainer) -> int:
    """The step Lightning logs epoch-end metrics at: the index of the epoch's (round's) last
    optimizer step, so that a round's rows follow its per-step rows."""
    return trainer.fit_loop.epoch_loop._batches_that_stepped - 1


def call_epoch_start_hooks(trainer: pl.Trainer) -> None:
    """Calls ``on_train_epoch_start`` on callbacks, then on the LightningModule, as Lightning does."""
    call._call_callback_hooks(trainer, "on_train_epoch_start")
    call._call_lightning_module_hook(trainer, "on_train_epoch_start")


def step_epoch_schedulers(fit_loop: _FitLoop) -> None:
    """Steps ``interval="epoch"`` LR schedulers once for the round.

    Lightning does this at an epoch's last batch, which :class:`ClientEpochLoop` suppresses
    inside clients; plateau schedulers still step after validation, in ``on_advance_end``.
    """
    fit_loop.epoch_loop.update_lr_schedulers("epoch", update_plateau_schedulers=False)


def reload_validation_data(trainer: pl.Trainer) -> None:
    """Makes the next validation run request ``val_dataloader()`` again (the evaluation set changed)."""
    trainer.fit_loop.epoch_loop.val_loop._combined_loader = None


def run_server_validation(fit_loop: _FitLoop) -> dict[str, float] | None:
    """Runs the validation loop on the current (global) model if it is due this epoch.

    Lightning would log the validation metrics as a row of their own; they are returned
    instead, so that the caller logs them in the round's row (callbacks still see them in
    ``callback_metrics``, as usual).

    Returns:
        The metrics validation logged, or ``None`` if validation was not due.
    """
    trainer, epoch_loop = fit_loop.trainer, fit_loop.epoch_loop
    if not epoch_loop._should_check_val_epoch():
        return None
    trainer.validating = True
    try:
        with _eval_end_metrics(trainer) as logged:
            epoch_loop.val_loop.run()
    finally:
        trainer.training = True
    return logged


def run_test_during_fit(trainer: pl.Trainer) -> dict[str, float]:
    """Runs the test loop on the current (global) model in the middle of ``fit``, without printing.

    As with :func:`run_server_validation`, the metrics are returned for the round's row instead
    of being logged as a row of their own; callbacks see them in ``callback_metrics``.
    """
    loop = trainer.test_loop
    verbose, loop.verbose = loop.verbose, False
    trainer.testing = True
    try:
        with _eval_end_metrics(trainer) as logged, sync_dist_advice_silenced():  # every rank tests the whole set
            loop.run()
    finally:
        loop.verbose = verbose
        trainer.training = True
    return logged


@contextmanager
def _eval_end_metrics(trainer: pl.Trainer) -> Iterator[dict[str, float]]:
    """Collects what an evaluation loop logs at its end instead of sending it to the loggers."""
    logged: dict[str, float] = {}
    connector = trainer._logger_connector
    connector.log_eval_end_metrics = lambda metrics: logged.update({k: float(v) for k, v in metrics.items()})  # type: ignore[method-assign]
    try:
        yield logged
    finally:
        del connector.log_eval_end_metrics


def evaluation_metric_names(trainer: pl.Trainer, stage: str) -> list[str]:
    """The names the LightningModule has logged with ``self.log`` in validation hooks
    (``stage="validate"``) or test hooks (``stage="test"``), in first-logged order."""
    hook = {"validate": "validation", "test": "test"}[stage]
    # A test run inside fit logs into the fit's validation results (Trainer._evaluation_loop
    # follows trainer.state.fn), so every evaluation loop's results are read, by hook name.
    loops = (trainer.fit_loop.epoch_loop.val_loop, trainer.validate_loop, trainer.test_loop)
    return list(dict.fromkeys(m.meta.name for loop in loops for m in loop._results.values() if hook in m.meta.fx))


def give_cli_hparams_only_to_configured_classes() -> None:
    """Makes LightningCLI hand a ``model``/``data`` block's hyper-parameters to the class that block names
    only, not to a LightningModule or LightningDataModule nested in its arguments.

    Lightning's instantiator applies to every ``LightningDataModule`` jsonargparse builds, so the user's
    datamodule inside ``fl_lightning.data.Federated`` got ``Federated``'s arguments as its ``hparams``
    (``self.hparams.batch_size`` failed). A nested module now records its own arguments, as in Python.
    Idempotent; applies to any LightningCLI in the process (``FederatedCLI`` or the user's own).
    """
    if getattr(_InstantiatorFn.__call__, "_fl_lightning", False):
        return
    instantiate = _InstantiatorFn.__call__

    def __call__(self: _InstantiatorFn, class_type: type, *args: Any, applied_instantiation_links: dict, **kwargs: Any) -> Any:
        if class_type is not _configured_class(self):
            return class_type(*args, **kwargs)
        return instantiate(self, class_type, *args, applied_instantiation_links=applied_instantiation_links, **kwargs)

    __call__._fl_lightning = True  # type: ignore[attr-defined]
    _InstantiatorFn.__call__ = __call__  # type: ignore[method-assign]


def _configured_class(instantiator: _InstantiatorFn) -> type | None:
    """The class the instantiator's config block names: its ``class_path``, else the CLI's own class."""
    cli = instantiator.cli
    cli._dump_config()
    block = cli.config_dump.get(instantiator.key)  # None without a `data:` block (a datamodule nested elsewhere)
    class_path = block.get("class_path") if isinstance(block, dict) else None
    if class_path is None:
        return cli.model_class if instantiator.key == "model" else cli.datamodule_class
    module, _, name = class_path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def adopt_hparams(target: HyperparametersMixin, source: HyperparametersMixin) -> None:
    """Gives ``target`` the ``hparams`` of ``source``, and Lightning logs them as it would ``source``'s
    (only if ``source`` called ``save_hyperparameters(logger=True)``)."""
    target._set_hparams(source.hparams)
    target._hparams_initial = source.hparams_initial
    target._log_hyperparams = source._log_hyperparams
