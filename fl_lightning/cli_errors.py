"""How ``fl-lightning`` reports a bad configuration: one ``error: ...`` line and exit status 2.

A value that a constructor refuses (``ValueError``/``TypeError`` raised when LightningCLI builds the
trainer, model, data or one of their parts), or that ``fit`` refuses before its first client trains (a
missing file included), is the user's configuration, not a bug: the traceback says nothing the message does not.
Errors raised once the run has started (a bug in a ``training_step``, a diverging run) keep their
traceback. ``FL_LIGHTNING_DEBUG=1`` keeps every traceback.
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

import lightning.pytorch as pl
from typing_extensions import override

from fl_lightning.algorithms import ClientContext
from fl_lightning.callbacks.federated_callback import FederatedCallback

#: Set to anything but ``""`` or ``"0"`` to see full tracebacks.
DEBUG_ENV = "FL_LIGHTNING_DEBUG"
#: The exit status of a configuration error, as argparse exits on a usage error.
EXIT_STATUS = 2
#: The errors a constructor or ``fit``'s set-up raises for a bad value or a missing file.
CONFIG_ERRORS = (ValueError, TypeError, FileNotFoundError)


class RunStarted(FederatedCallback):
    """Records whether the run got past its set-up: an error before that is a configuration error.

    In ``fit`` the set-up ends when the first client starts training: the federated loop checks
    what it can only check then (clients per round against the federation, whether the client
    executor can run the algorithm) after Lightning's ``on_train_start``. In ``validate``, ``test``
    and ``predict`` it ends when the evaluation starts (Lightning's sanity check is still set-up).
    """

    def __init__(self) -> None:
        self.started = False

    @override
    def on_client_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, client: ClientContext) -> None:
        self.started = True

    def _evaluation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.started = self.started or not trainer.sanity_checking

    on_validation_start = on_test_start = on_predict_start = override(_evaluation_start)


def debugging() -> bool:
    """Whether ``FL_LIGHTNING_DEBUG`` asks for full tracebacks."""
    return os.environ.get(DEBUG_ENV, "") not in ("", "0")


@contextmanager
def configuration_errors(run: RunStarted) -> Iterator[None]:
    """Turns a configuration error raised before ``run`` started into one ``error:`` line and exit status 2."""
    try:
        yield
    except CONFIG_ERRORS as error:
        if run.started or debugging():
            raise
        print(f"error: {one_line(error)}", file=sys.stderr)
        raise SystemExit(EXIT_STATUS) from None


def one_line(error: BaseException) -> str:
    """The message of the error that the configuration caused, prefixed by the class that refused it.

    jsonargparse wraps a constructor's error in its own (``Does not validate against any of the Union
    subtypes``, listing every candidate type); the constructor's error is at the end of that chain.
    """
    while error.__cause__ is not None and _raised_by_jsonargparse(error):
        error = error.__cause__
    message = " ".join(str(error).split())
    owner = _refusing_class(error)
    return f"{owner}: {message}" if owner and not message.startswith(owner) else message


def _modules(error: BaseException) -> list[tuple[str, FrameType]]:
    """The traceback's frames, innermost first, with their modules' names."""
    frames = [frame for frame, _ in traceback.walk_tb(error.__traceback__)]
    return [(frame.f_globals.get("__name__", ""), frame) for frame in reversed(frames)]


def _raised_by_jsonargparse(error: BaseException) -> bool:
    modules = _modules(error)
    return bool(modules) and modules[0][0].startswith("jsonargparse")


def _refusing_class(error: BaseException) -> str | None:
    """The class whose ``__init__`` raised ``error``, directly or through helpers of the same code base;
    none when the error comes out of a method that the CLI or Lightning called (``fit``'s set-up)."""
    for module, frame in _modules(error):
        if module.startswith(("jsonargparse", "lightning")):
            return None
        if frame.f_code.co_name == "__init__" and "self" in frame.f_locals:
            return type(frame.f_locals["self"]).__name__
    return None
