"""Unique W&B run names for runs started from the same config file.

A config that fixes a W&B logger's ``name`` (``name: quickstart``) would give every run the same
name in the W&B project. The CLI appends the run's start time, as Hydra names its run folders:
``quickstart-20261126-004512``. A logger that also fixes the run's ``id`` (or ``version``) names one
run on purpose, to resume it (``fl-lightning-compare`` does): its name is kept. CSV and TensorBoard
loggers need nothing: each run gets its own ``version_<n>`` folder under the fixed name.
"""

from __future__ import annotations

import importlib
import re
from datetime import datetime
from typing import Any

from jsonargparse import Namespace
from lightning.pytorch.loggers import WandbLogger

#: The start time's format in a run name (sorts by time; no characters a file name or W&B refuses).
TIMESTAMP = "%Y%m%d-%H%M%S"
_STAMP = re.compile(r"-\d{8}-\d{6}$")


def stamped(name: str, start: datetime) -> str:
    """``name-<start>``; a stamp already there (a saved config, run again) is replaced, not stacked."""
    return f"{_STAMP.sub('', name)}-{start.strftime(TIMESTAMP)}"


def stamp_wandb_names(logger: Any, start: datetime) -> None:
    """Stamps the ``name`` of every W&B logger in a parsed ``trainer.logger`` config that fixes a name but
    not a run id, in place."""
    for entry in logger if isinstance(logger, list) else [logger]:
        if not (isinstance(entry, Namespace) and _is_wandb(entry.get("class_path"))):
            continue
        init_args = entry.get("init_args") or Namespace()
        if init_args.get("name") and not (init_args.get("id") or init_args.get("version")):
            init_args["name"] = stamped(init_args["name"], start)


def _is_wandb(class_path: Any) -> bool:
    if not isinstance(class_path, str) or "." not in class_path:
        return False
    module, _, name = class_path.rpartition(".")
    cls = getattr(importlib.import_module(module), name, None)
    return isinstance(cls, type) and issubclass(cls, WandbLogger)
