"""Every hook Lightning's epoch loop runs during a client's steps is known to :mod:`fl_lightning.loops.skipped_features`,
and the batched executor names each one a module or callback overrides.

The hooks are read from Lightning at run time, not listed here: a module and a callback that record every hook they
are called with train one round through the Lightning executor, and what was called between ``on_client_start``
and ``on_client_end`` is what a direct executor would skip.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable
from typing import Any

import lightning.pytorch as pl
import pytest
from lightning.pytorch.callbacks import Callback

from fl_lightning import _lightning_compat as compat
from fl_lightning.callbacks.federated_callback import FederatedCallback
from fl_lightning.loops.skipped_features import MODULE_STEP_METHODS, STEP_HOOKS
from fl_lightning.models import MLP

from .test_batched_clients import synthetic_data
from ..integration.conftest import quiet_trainer

#: What every executor runs itself (the step and the forward pass it calls), or what the batched executor refuses when
#: overridden (batch transfer).
RUN_OR_REFUSED = ("training_step", "forward", *compat.BATCH_TRANSFER_HOOKS)


def _lightning_methods(cls: type) -> list[str]:
    """The public methods that Lightning's classes in ``cls``'s bases define (hooks, and the methods Lightning calls)."""
    names = {
        name for base in cls.__mro__ if base.__module__.startswith("lightning.")
        for name, value in vars(base).items() if not name.startswith("_") and inspect.isfunction(value)
    }
    return sorted(names)


def _recording(base: type, names: list[str], calls: list[str], inside: list[bool]) -> type:
    """``base`` with each method of ``names`` overridden to note its name (while ``inside[0]``) and call the original."""
    def wrap(name: str) -> Callable[..., Any]:
        def method(self: Any, *args: Any, **kwargs: Any) -> Any:
            if inside[0]:
                calls.append(name)
            return getattr(super(cls, self), name)(*args, **kwargs)
        return method

    cls = type(f"Recording{base.__name__}", (base,), {name: wrap(name) for name in names})
    return cls


class _ClientSpan(FederatedCallback):
    """Sets ``inside[0]`` while a client trains."""

    def __init__(self, inside: list[bool]) -> None:
        self.inside = inside

    def on_client_start(self, trainer: Any, pl_module: Any, client: Any) -> None:
        self.inside[0] = True

    def on_client_end(self, trainer: Any, pl_module: Any, client: Any, update: Any) -> None:
        self.inside[0] = False


def _fit(executor: str, module: pl.LightningModule, callbacks: list[Callback]) -> None:
    trainer = quiet_trainer(client_executor=executor, max_epochs=1, clients_per_round=2, callbacks=callbacks)
    trainer.fit(module, datamodule=synthetic_data(drop_last=True))


#: Methods a module may not override (a deprecated hook Lightning refuses next to its successor) or that only the
#: user's own code calls (logging, export).
NOT_WRAPPED = frozenset({"configure_sharded_model", "log", "log_dict", "print", "all_gather", "to_onnx", "to_torchscript"})

SIZES = {"in_features": 12, "hidden": (16,), "num_classes": 4, "lr": 0.1}


@pytest.fixture(scope="module")
def client_hooks() -> tuple[set[str], set[str]]:
    """The module's and the callback's methods Lightning calls during a client's steps."""
    module_calls: list[str] = []
    callback_calls: list[str] = []
    inside = [False]
    module_class = _recording(MLP, [n for n in _lightning_methods(MLP) if n not in NOT_WRAPPED], module_calls, inside)
    callback_class = _recording(Callback, _lightning_methods(Callback), callback_calls, inside)
    _fit("lightning", module_class(**SIZES), [_ClientSpan(inside), callback_class()])
    return set(module_calls), set(callback_calls)


def test_every_hook_run_during_a_clients_steps_is_known_to_skipped_features(client_hooks) -> None:
    module_hooks, callback_hooks = client_hooks
    assert "on_train_batch_start" in callback_hooks and "optimizer_step" in module_hooks  # the recording works
    assert module_hooks - {*STEP_HOOKS, *MODULE_STEP_METHODS, *RUN_OR_REFUSED} == set()
    assert callback_hooks - set(STEP_HOOKS) == set()


def test_batched_names_every_overridden_step_hook_of_the_module_and_the_callbacks(client_hooks) -> None:
    module_hooks, callback_hooks = client_hooks
    module_hooks = module_hooks - set(RUN_OR_REFUSED)
    unused: list[str] = []
    module = _recording(MLP, sorted(module_hooks), unused, [False])(**SIZES)  # each hook overridden, calling Lightning's
    callback = _recording(Callback, sorted(callback_hooks), unused, [False])()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _fit("batched", module, [callback])
    skipped = [str(w.message) for w in caught if "client_executor='batched' skips" in str(w.message)]
    assert len(skipped) == 1
    for name in module_hooks:
        assert f"RecordingMLP.{name}" in skipped[0], name
    for name in callback_hooks:
        assert f"RecordingCallback.{name}" in skipped[0], name
