"""How ``fl-lightning`` reports a bad configuration: one ``error: ...`` line and exit status 2.

A value that a constructor refuses (``ValueError``/``TypeError`` raised when LightningCLI builds the
trainer, model, data or one of their parts), or that ``fit`` refuses before its first client trains (a
missing file included), is the user's configuration, not a bug: the traceback says nothing the message does not.
Errors raised once the run has started (a bug in a ``training_step``, a diverging run) keep their
traceback, except a :class:`~fl_lightning.data._data_checks.ClientDataError` (a client's data the configuration
cannot train, such as a 1-sample batch under BatchNorm). ``FL_LIGHTNING_DEBUG=1`` keeps every traceback.
"""

from __future__ import annotations

import contextlib
import difflib
import errno
import importlib
import inspect
import os
import re
import shutil
import sys
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import NoReturn

import lightning.pytorch as pl
from typing_extensions import override

from fl_lightning._lazy import public_names
from fl_lightning.algorithms import ClientContext
from fl_lightning.cli.help import PlainHelpParser
from fl_lightning.data._data_checks import ClientDataError
from fl_lightning.callbacks.federated_callback import FederatedCallback
from fl_lightning.checkpointing import run_directory

#: Set to anything but ``""`` or ``"0"`` to see full tracebacks.
DEBUG_ENV = "FL_LIGHTNING_DEBUG"
#: The exit status of a configuration error, as argparse exits on a usage error.
EXIT_STATUS = 2
#: The errors a constructor or ``fit``'s set-up raises for a bad value or a missing file.
CONFIG_ERRORS = (ValueError, TypeError, FileNotFoundError)


class RunStarted(FederatedCallback):
    """Records whether the run got past its set-up: an error before that is a configuration error, and the
    log folder it leaves is removed (:meth:`remove_unstarted_run_directory`).

    In ``fit`` the set-up ends when the first client starts training: the federated loop checks
    what it can only check then (clients per round against the federation, whether the client
    executor can run the algorithm) after Lightning's ``on_train_start``. In ``validate``, ``test``
    and ``predict`` it ends when the evaluation starts (Lightning's sanity check is still set-up).
    """

    def __init__(self) -> None:
        self.started = False
        # A margin for file systems whose timestamps are coarser than time.time().
        self._created_since = time.time() - 2
        self._unstarted_directory: str | None = None

    @override
    def on_client_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, client: ClientContext) -> None:
        self.started = True

    def _evaluation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.started = self.started or not trainer.sanity_checking

    on_validation_start = on_test_start = on_predict_start = override(_evaluation_start)

    @override
    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        if not self.started and trainer.is_global_zero:
            self._unstarted_directory = run_directory(trainer)

    def remove_unstarted_run_directory(self) -> None:
        """Removes the log folder (``logs/<name>/version_<n>``) of a run that failed before it started, if
        every file in it was written by this run and none is a checkpoint; then its parent, if left empty."""
        directory = self._unstarted_directory
        if directory is None or not os.path.isdir(directory):
            return
        files = [os.path.join(root, name) for root, _, names in os.walk(directory) for name in names]
        if any(path.endswith(".ckpt") or os.path.getmtime(path) < self._created_since for path in files):
            return
        shutil.rmtree(directory)
        with contextlib.suppress(OSError):  # not empty: other runs' folders
            os.rmdir(os.path.dirname(directory))


def debugging() -> bool:
    """Whether ``FL_LIGHTNING_DEBUG`` asks for full tracebacks."""
    return os.environ.get(DEBUG_ENV, "") not in ("", "0")


@contextmanager
def configuration_errors(run: RunStarted | None = None) -> Iterator[None]:
    """Turns a configuration error raised before ``run`` started (``None``: a block that only reads and checks
    the configuration) into one ``error:`` line and exit status 2."""
    try:
        yield
    except CONFIG_ERRORS as error:
        mid_run = run is not None and run.started and not isinstance(error, ClientDataError)
        if mid_run or debugging():
            raise
        print(f"error: {one_line(error)}", file=sys.stderr)
        if run is not None:
            run.remove_unstarted_run_directory()
        raise SystemExit(EXIT_STATUS) from None


#: The ``OSError`` numbers of a file the run may not write: the machine's settings, not a bug.
_UNWRITABLE = {
    errno.EACCES: "permission denied (a read-only folder? choose another with --trainer.default_root_dir)",
    errno.EPERM: "operation not permitted (choose another folder with --trainer.default_root_dir)",
    errno.EROFS: "read-only file system (choose another folder with --trainer.default_root_dir)",
    errno.ENOTDIR: "a part of the path is a file, not a folder",
    errno.EFBIG: "file too large for the process's file size limit (ulimit -f)",
    errno.ENOSPC: "no space left on the device",
    errno.EDQUOT: "disk quota exceeded",
}


@contextmanager
def file_system_errors() -> Iterator[None]:
    """Turns an ``OSError`` of a file the run may not write (a read-only folder, ``ulimit -f``, a full disk),
    raised at any point of the run, into one ``error:`` line naming the file, and exit status 1."""
    try:
        yield
    except OSError as error:
        reason = _UNWRITABLE.get(error.errno) if error.errno is not None else None
        if reason is None or debugging():
            raise
        where = f"{error.filename}: " if error.filename else "a file: "
        print(f"error: cannot write {where}{reason}.", file=sys.stderr)
        raise SystemExit(1) from None


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


# The lines of a nested jsonargparse error that only say where the parser looked, not what is wrong.
_NOT_A_REASON = re.compile(
    r"^(-\s*)?(Parser key |Does not validate against|Subtypes:|Errors:|Expected a <class 'NoneType'>|Given value|"
    r"Problem with given class_path )"
)
_MISSING_ATTRIBUTE = re.compile(r"module '([\w.]+)' has no attribute '(\w+)'")
_MISSING_MODULE = re.compile(r"No module named '([\w.]+)'")
_UNKNOWN_ARGUMENT = re.compile(r"Option '(\w+)' is not accepted")
_UNKNOWN_OPTION = re.compile(r"Subcommand '(\w+)' does not accept option '([\w.]+)'")
_BARE_CLASS = re.compile(r"Expected a dot import path string: (\w+)\b")
#: Method names of the papers that are spelt as a setting here (README's method table).
_SPELT_AS_SETTINGS = {
    "FedAvgM": "fl_lightning.FedAvg with server_optimizer: fl_lightning.ServerSGD (momentum > 0)",
    "FedAdagrad": "fl_lightning.FedAvg with server_optimizer: fl_lightning.ServerAdagrad",
    "FedAdam": "fl_lightning.FedAvg with server_optimizer: fl_lightning.ServerAdam",
    "FedYogi": "fl_lightning.FedAvg with server_optimizer: fl_lightning.ServerYogi",
}


def closest(name: str, candidates: list[str]) -> str | None:
    """The candidate ``name`` most likely means: one equal but for case first, else the closest spelling."""
    folded = {candidate.casefold(): candidate for candidate in candidates}
    key = name.casefold()
    if key not in folded:
        close = difflib.get_close_matches(key, list(folded), n=1)
        key = close[0] if close else ""
    return folded.get(key)


def public_class_paths() -> dict[str, str]:
    """Every public name of fl_lightning and its lazy subpackages by its full import path, the shortest first."""
    paths: dict[str, str] = {}
    for package, name in public_names():
        paths.setdefault(name, f"{package}.{name}")
    return paths


def init_arguments(class_path: str) -> list[str]:
    """The keyword arguments the constructors of ``class_path``'s class and its bases take (none if it does not import)."""
    module, _, name = class_path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        return []
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return sorted({
        p.name for base in inspect.getmro(cls) if "__init__" in vars(base)
        for p in inspect.signature(base.__init__).parameters.values() if p.kind in kinds and p.name != "self"
    })  # fmt: skip


def _suggestion(reason: str, class_path: str | None) -> str:
    """`` (did you mean ...?)`` for a misspelt class path, argument or class name in ``reason``, else ``""``."""
    if missing := _MISSING_ATTRIBUTE.search(reason):
        module, name = missing.groups()
        match = closest(name, dir(importlib.import_module(module)))
        return f" (did you mean {module}.{match}?)" if match else ""
    if (unknown := _UNKNOWN_ARGUMENT.search(reason)) and class_path:
        match = closest(unknown.group(1), init_arguments(class_path))
        return f" (did you mean {match}?)" if match else ""
    if bare := _BARE_CLASS.search(reason):
        name = bare.group(1)
        if name in _SPELT_AS_SETTINGS:
            return f" ({name} is {_SPELT_AS_SETTINGS[name]})"
        paths = public_class_paths()
        match = closest(name, list(paths))
        return f" (did you mean {paths[match]}?)" if match else ""
    return ""


def condense_parse_error(message: str) -> str:
    r"""jsonargparse's nested parse error as one line: the configuration key, the class path and the
    innermost reason (with the closest names for a misspelt class path).

    >>> nested = (
    ...     'Parser key "data":\n  Errors:\n'
    ...     "    - Problem with given class_path 'fl_lightning.data.FederatedDataModule':\n"
    ...     '        Parser key "partitioner":\n'
    ...     "            - Problem with given class_path 'fl_lightning.data.Dirichlett':\n"
    ...     "                module 'fl_lightning.data' has no attribute 'Dirichlett'\n"
    ...     "            - Expected a <class 'NoneType'>"
    ... )
    >>> print(condense_parse_error(nested).replace(": ", ":\n"))
    data.partitioner:
    fl_lightning.data.Dirichlett:
    module 'fl_lightning.data' has no attribute 'Dirichlett' (did you mean fl_lightning.data.Dirichlet?)
    """
    lines = [line for line in message.splitlines() if line.strip()]
    reasons = [line for line in lines if not _NOT_A_REASON.match(line.strip())]
    if len(lines) == 1 or not reasons:
        return " ".join(message.split())
    innermost = max(reasons, key=lambda line: len(line) - len(line.lstrip()))
    reason = innermost.strip().removeprefix("- ")
    above = lines[: lines.index(innermost)]
    class_paths = [m.group(1) for line in above for m in [re.search(r"Problem with given class_path '([^']+)'", line)] if m]
    if class_paths:
        reason = f"{class_paths[-1]}: {reason}"
    given = re.search(r"^\s*Given value: (.*)$", message, flags=re.M)
    if given and reason.startswith("Expected") and "Got value" not in reason and len(given.group(1)) <= 80:
        reason += f", got {given.group(1)}"
    keys = ".".join(re.findall(r'Parser key "([^"]+)"', message))
    reason += _suggestion(reason, class_paths[-1] if class_paths else None)
    if _MISSING_MODULE.search(reason):
        reason += f" (modules are imported from the working directory {os.getcwd()} and the installed packages)"
    return f"{keys}: {reason}" if keys else reason


class ConsoleParser(PlainHelpParser):
    """The console script's parser: a configuration that does not parse is one ``error:`` line and a tip,
    not the usage of every option and jsonargparse's nested report (``FL_LIGHTNING_DEBUG=1`` keeps it)."""

    @override
    def error(self, message: str, ex: Exception | None = None) -> NoReturn:
        if not self.exit_on_error or debugging():
            super().error(message, ex)
        prog = self.prog.replace(" [options]", "")
        line = condense_parse_error(message)
        if unknown := _UNKNOWN_OPTION.search(message):  # raised by the top parser, about one subcommand's option
            subcommand, option = unknown.groups()
            prog = f"{prog} {subcommand}"
            match = closest(option, self._subcommand_options(subcommand))
            line += f" (did you mean {match}?)" if match else ""
        print(f"error: {line}\ntip: the accepted options: {prog} --help", file=sys.stderr)
        raise SystemExit(EXIT_STATUS)

    def _subcommand_options(self, subcommand: str) -> list[str]:
        """The option keys (``trainer.local_epochs``, ...) that ``subcommand`` accepts; none if it has no parser here."""
        subcommands = getattr(self, "_subcommands_action", None)
        parser = getattr(subcommands, "_name_parser_map", {}).get(subcommand)
        return [action.dest for action in parser._actions] if parser is not None else []
