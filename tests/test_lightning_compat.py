"""Contract test of ``fl_lightning/_lightning_compat.py``.

Every protected Lightning name that module touches is asserted here, with the shape it relies
on. When this file fails after a Lightning upgrade, review ``fl_lightning/_lightning_compat.py``
(and only then relax the assertion that failed).
"""

from __future__ import annotations

import inspect
from typing import Any

import lightning
import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import Callback, Timer
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.loops.fetchers import _DataFetcher
from lightning.pytorch.loops.fit_loop import _FitLoop
from lightning.pytorch.loops.loop import _Loop
from lightning.pytorch.loops.optimization.automatic import ClosureResult, _AutomaticOptimization
from lightning.pytorch.loops.progress import _Progress
from lightning.pytorch.loops.training_epoch_loop import _TrainingEpochLoop
from lightning.pytorch.trainer import call
from lightning.pytorch.utilities.combined_loader import CombinedLoader

from fl_lightning import FederatedTrainer
from fl_lightning import _lightning_compat as compat
from fl_lightning.data import FederatedDataModule, InMemoryDataset, client_batches
from fl_lightning.models import LogisticRegression
from tests.quiet import QUIET
from tests.recording_logger import RecordingLogger

REVIEW = "review fl_lightning/_lightning_compat.py against this Lightning release"



def _params(fn: Any) -> list[str]:
    return list(inspect.signature(fn).parameters)


@pytest.fixture
def trainer() -> pl.Trainer:
    return pl.Trainer(**QUIET, max_epochs=1)


def test_lightning_version_is_pinned() -> None:
    assert lightning.__version__.startswith("2.6."), (
        f"Lightning {lightning.__version__} is not 2.6.x: {REVIEW}, run tests/test_lightning_compat.py, "
        "then update the pin in pyproject.toml and this test."
    )


def test_fit_loop_shape(trainer: pl.Trainer) -> None:
    assert compat.FitLoopBase is _FitLoop
    # The logger connector and tuner dispatch on this exact class.
    assert pl.loops._FitLoop is _FitLoop, REVIEW
    assert _params(_FitLoop.__init__) == ["self", "trainer", "min_epochs", "max_epochs"], REVIEW
    loop = trainer.fit_loop
    assert isinstance(loop, _FitLoop)
    assert isinstance(loop.epoch_loop, _TrainingEpochLoop), REVIEW
    assert isinstance(loop.epoch_progress, _Progress), REVIEW
    for name in ("_data_fetcher", "_combined_loader"):
        assert name in vars(loop) and getattr(loop, name) is None, f"_FitLoop.{name}: {REVIEW}"
    assert loop.max_batches == float("inf"), REVIEW
    for name in ("setup_data", "reset", "run", "on_run_start", "on_advance_start", "advance", "on_advance_end",
                 "on_save_checkpoint", "on_load_checkpoint"):
        assert callable(getattr(_FitLoop, name, None)), f"_FitLoop.{name}: {REVIEW}"
        assert _params(getattr(_FitLoop, name))[0] == "self"
    assert _params(_FitLoop.setup_data) == ["self"], REVIEW
    assert _params(_FitLoop.run) == ["self"], REVIEW  # FederatedFitLoop.run restores the global model however it ends
    assert _params(_FitLoop.on_advance_end) == ["self"], REVIEW
    # FederatedTrainer installs its loops by plain assignment; trainer.current_epoch reads the progress.
    trainer.fit_loop = _FitLoop(trainer, min_epochs=0, max_epochs=2)
    trainer.fit_loop.epoch_loop = compat.ClientEpochLoop(trainer, min_steps=None, max_steps=-1)
    trainer.fit_loop.epoch_progress.current.completed = 2
    assert trainer.current_epoch == 2, REVIEW


def test_training_epoch_loop_shape(trainer: pl.Trainer) -> None:
    assert _params(_TrainingEpochLoop.__init__) == ["self", "trainer", "min_steps", "max_steps"], REVIEW
    assert _params(_TrainingEpochLoop._should_check_val_fx) == ["self", "data_fetcher"], REVIEW
    assert _params(_TrainingEpochLoop.update_lr_schedulers) == ["self", "interval", "update_plateau_schedulers"], REVIEW
    assert _params(_TrainingEpochLoop._num_ready_batches_reached) == ["self"], REVIEW
    assert _params(_TrainingEpochLoop._should_check_val_epoch) == ["self"], REVIEW
    assert _params(_TrainingEpochLoop.run) == ["self", "data_fetcher"], REVIEW
    assert isinstance(inspect.getattr_static(_TrainingEpochLoop, "global_step"), property), REVIEW

    loop = trainer.fit_loop.epoch_loop
    # Lightning's logging step counter, which epoch_end_log_step reads: a plain int attribute.
    assert "_batches_that_stepped" in vars(loop) and vars(loop)["_batches_that_stepped"] == 0, REVIEW
    assert not hasattr(_TrainingEpochLoop, "_batches_that_stepped"), REVIEW
    assert isinstance(loop.val_loop, _Loop), REVIEW
    assert callable(loop.val_loop.run), REVIEW
    assert loop.global_step == 0
    # The step output's class, which ClientEpochLoop(returned_loss_key=...) replaces to keep the returned loss.
    assert loop.automatic_optimization.output_result_cls is ClosureResult, REVIEW
    assert _params(ClosureResult.from_training_step_output) == ["training_step_output", "normalize"], REVIEW
    assert "output_result_cls.from_training_step_output(training_step_output, trainer.accumulate_grad_batches)" in (
        inspect.getsource(_AutomaticOptimization._training_step)
    ), REVIEW


def test_client_epoch_loop_only_overrides_existing_methods() -> None:
    own = {name for name in vars(compat.ClientEpochLoop) if not name.startswith("__")}
    methods = own - {"in_client"}
    assert {
        "_should_check_val_fx",
        "update_lr_schedulers",
        "_num_ready_batches_reached",
        "_build_kwargs",
        "_broadcast_sigterm_tensor",
        "done",
    } <= methods
    for name in methods:
        base = inspect.getattr_static(_TrainingEpochLoop, name, None)
        if isinstance(base, property):  # `done`: a property read by the loop's `run`
            assert isinstance(inspect.getattr_static(compat.ClientEpochLoop, name), property), f"{name}: {REVIEW}"
            continue
        assert callable(base), f"ClientEpochLoop.{name} overrides nothing in _TrainingEpochLoop: {REVIEW}"
        assert _params(base) == _params(getattr(compat.ClientEpochLoop, name)), f"{name}: {REVIEW}"


def test_timer_interval_is_readable() -> None:
    """``acts_only_at_epoch_ends`` reads a Timer's interval: ``max_time`` becomes an epoch-interval Timer."""
    assert compat.acts_only_at_epoch_ends(Timer(duration="00:00:01:00", interval="epoch")), REVIEW
    assert not compat.acts_only_at_epoch_ends(Timer(duration="00:00:01:00", interval="step")), REVIEW


def test_data_fetcher_over_a_client_batch_stream() -> None:
    assert _params(_DataFetcher.__init__) == ["self"], REVIEW
    assert _params(_DataFetcher.setup) == ["self", "combined_loader"], REVIEW
    data = InMemoryDataset(inputs=torch.arange(6.0).unsqueeze(1), labels=torch.zeros(6, dtype=torch.int64), num_classes=1)
    batches = client_batches(data, range(6), batch_size=2, num_epochs=1, generator=torch.Generator().manual_seed(0))
    # What run_client_epoch builds: one sized iterable in max_size_cycle mode.
    combined = CombinedLoader(batches, "max_size_cycle")
    fetcher = _DataFetcher()
    fetcher.setup(combined)
    assert iter(fetcher) is fetcher
    assert fetcher.length == 3 and not fetcher.done, REVIEW
    seen = []
    for expected_idx in range(3):
        (x, _), batch_idx, dataloader_idx = next(fetcher)
        assert (batch_idx, dataloader_idx) == (expected_idx, 0), REVIEW
        seen += x.flatten().tolist()
    assert sorted(seen) == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0], REVIEW
    # The epoch loop reads ``done`` to flag the last batch.
    assert fetcher.done and fetcher.fetched == 3, REVIEW


def test_progress_trackers(trainer: pl.Trainer) -> None:
    progress = _Progress()
    for tracker in (progress.total, progress.current):
        for field in ("ready", "started", "processed", "completed"):
            assert getattr(tracker, field) == 0, f"_Progress tracker .{field}: {REVIEW}"
    for name in ("increment_ready", "increment_started", "increment_processed", "increment_completed"):
        assert callable(getattr(progress, name)), f"_Progress.{name}: {REVIEW}"

    compat.set_completed_epochs(trainer.fit_loop.epoch_progress, 4)
    for tracker in (trainer.fit_loop.epoch_progress.total, trainer.fit_loop.epoch_progress.current):
        assert (tracker.ready, tracker.started, tracker.processed, tracker.completed) == (4, 4, 4, 4)
    assert trainer.current_epoch == 4, REVIEW


def test_clear_restarting_clears_the_loop_tree(trainer: pl.Trainer) -> None:
    restarting = inspect.getattr_static(_Loop, "restarting")
    assert isinstance(restarting, property) and restarting.fset is not None, REVIEW
    loop = trainer.fit_loop
    _Loop.restarting.fset(loop, True)
    assert loop.restarting and loop.epoch_loop.restarting and loop.epoch_loop.val_loop.restarting
    compat.clear_restarting(loop)
    assert not loop.restarting and not loop.epoch_loop.restarting and not loop.epoch_loop.val_loop.restarting, REVIEW


def test_logger_connector_log_metrics_and_callback_metrics() -> None:
    connector_cls = type(pl.Trainer(**QUIET)._logger_connector)
    assert _params(connector_cls.log_metrics) == ["self", "metrics", "step"], REVIEW
    logger = RecordingLogger()
    trainer = pl.Trainer(**{**QUIET, "logger": logger})
    assert isinstance(trainer._logger_connector._callback_metrics, dict), REVIEW
    compat.log_metrics(trainer, {"round/x": 2.5}, step=7)
    assert logger.records == [(7, {"round/x": 2.5})], REVIEW
    assert trainer.callback_metrics["round/x"].item() == 2.5, REVIEW


def test_training_steps_outside_the_epoch_loop_log_as_lightning_expects() -> None:
    """What the lean executor relies on: ``self.log`` reads ``_current_fx_name``, and the logger
    connector's ``on_batch_start`` readies the batch (its size) for ``self.log``."""
    connector_cls = type(pl.Trainer(**QUIET)._logger_connector)
    assert _params(connector_cls.on_batch_start)[:2] == ["self", "batch"], REVIEW
    module = BoringModel()
    trainer = pl.Trainer(**QUIET)
    trainer.strategy.connect(module)
    module._current_fx_name = "before"
    with compat.TrainingStepScope(module):
        assert module._current_fx_name == "training_step", REVIEW
    assert module._current_fx_name == "before", REVIEW


def test_call_hook_dispatch() -> None:
    assert _params(call._call_callback_hooks)[:2] == ["trainer", "hook_name"], REVIEW
    assert _params(call._call_lightning_module_hook)[:2] == ["trainer", "hook_name"], REVIEW

    order: list[str] = []

    class Module(pl.LightningModule):
        def on_train_epoch_start(self) -> None:
            order.append("module")

    class Recorder(Callback):
        def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
            assert pl_module is module
            order.append("callback")

    module = Module()
    trainer = pl.Trainer(**QUIET, callbacks=[Recorder()])
    trainer.strategy.connect(module)
    compat.call_epoch_start_hooks(trainer)
    assert order == ["callback", "module"], REVIEW


class _LoggingLogisticRegression(LogisticRegression):
    """Logs its training loss through Lightning's own on_epoch aggregation."""

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = super().training_step(batch, batch_idx)
        self.log("train_loss", loss, on_step=False, on_epoch=True, batch_size=len(batch[1]))
        return loss


def _tiny_fit(**trainer_kwargs: Any) -> tuple[FederatedTrainer, RecordingLogger, LogisticRegression]:
    g = torch.Generator().manual_seed(0)
    train = InMemoryDataset(inputs=torch.randn(24, 4, generator=g), labels=torch.randint(0, 2, (24,), generator=g), num_classes=2)
    val = InMemoryDataset(inputs=torch.randn(8, 4, generator=g), labels=torch.randint(0, 2, (8,), generator=g), num_classes=2)
    logger = RecordingLogger()
    trainer = FederatedTrainer(
        **{**QUIET, "logger": logger, "log_every_n_steps": 1, "max_epochs": 3, "clients_per_round": 2, **trainer_kwargs}
    )
    model = _LoggingLogisticRegression(in_features=4, num_classes=2, lr=0.1)
    trainer.fit(model, datamodule=FederatedDataModule(train, val=val, num_clients=3, batch_size=4))
    return trainer, logger, model


def test_epoch_end_log_step_is_the_last_optimizer_step() -> None:
    trainer = FederatedTrainer(**QUIET, max_epochs=5)
    epoch_loop = trainer.fit_loop.epoch_loop
    assert isinstance(epoch_loop, compat.ClientEpochLoop)
    epoch_loop._batches_that_stepped = 7  # what Lightning counts after 7 optimizer steps
    assert compat.epoch_end_log_step(trainer) == 6


def test_eval_end_metrics_are_logged_through_one_connector_method() -> None:
    connector_cls = type(pl.Trainer(**QUIET)._logger_connector)
    assert _params(connector_cls.log_eval_end_metrics) == ["self", "metrics"], REVIEW


def test_every_logger_counts_rounds_and_validation_runs_once_per_round() -> None:
    validations: list[int] = []

    class CountValidation(Callback):
        def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
            validations.append(trainer.current_epoch)

    # Plain Lightning would validate at the end of every client's epoch (val_check_interval=1.0).
    trainer, logger, _ = _tiny_fit(callbacks=[CountValidation()])
    assert trainer.current_epoch == 3
    assert trainer.global_step > 3  # several optimizer steps per round...
    assert validations == [0, 1, 2]  # ...but one server evaluation per round
    round_steps = logger.steps("round/clients")
    assert [m["round"] for _, m in logger.records if "round" in m] == [0, 1, 2]
    # Validation is in the round's row; Lightning's epoch-end row (train_loss) shares its step.
    assert logger.steps("val_loss") == round_steps == logger.steps("train_loss")
    assert round_steps == sorted(set(round_steps)) and round_steps[-1] == trainer.global_step - 1
    assert trainer.fit_loop.epoch_loop._batches_that_stepped == trainer.global_step


def test_evaluation_results_record_each_metrics_hook_and_name() -> None:
    trainer, _, _ = _tiny_fit()
    assert compat.evaluation_metric_names(trainer, "validate") == ["val_loss", "val_acc"]
    assert compat.evaluation_metric_names(trainer, "test") == []
    assert isinstance(trainer.test_loop.verbose, bool), REVIEW  # run_test_during_fit silences it


def test_lightning_cli_instantiator_and_hparams_shape() -> None:
    from lightning.pytorch.cli import LightningCLI, _InstantiatorFn
    from lightning.pytorch.core.mixins import HyperparametersMixin

    assert _params(_InstantiatorFn.__call__) == ["self", "class_type", "args", "applied_instantiation_links", "kwargs"], REVIEW
    assert callable(LightningCLI._dump_config), REVIEW
    mixin = HyperparametersMixin()
    assert mixin._log_hyperparams is False and callable(mixin._set_hparams), REVIEW
