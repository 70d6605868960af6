"""The modules moved by the package's relayout (issue 31), importable at their old paths for one release.

Importing an old path warns once with a ``DeprecationWarning`` naming the new one and returns the
moved module itself (not a copy), so ``isinstance`` checks and monkeypatching see one object.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType

#: Old public module path -> new path. Written by the relayout script; private modules are not listed.
MOVED: dict[str, str] = {
    "fl_lightning.algorithms.shared.base": "fl_lightning.algorithms.shared.algorithm",
    "fl_lightning.algorithms.shared.client_state": "fl_lightning.algorithms.shared.optimizer_state",
    "fl_lightning.checkpoint_io": "fl_lightning.checkpointing.checkpoint_io",
    "fl_lightning.cli_errors": "fl_lightning.cli.errors",
    "fl_lightning.cli_help": "fl_lightning.cli.help",
    "fl_lightning.compression.base": "fl_lightning.compression.codec",
    "fl_lightning.compression.masked_noise": "fl_lightning.compression.masked_noise_codec",
    "fl_lightning.compression.probability_mask": "fl_lightning.compression.probability_mask_codec",
    "fl_lightning.data.datasets.base": "fl_lightning.data.datasets.in_memory",
    "fl_lightning.federation": "fl_lightning.server.federation",
    "fl_lightning.fingerprint": "fl_lightning.checkpointing.fingerprint",
    "fl_lightning.loops.services": "fl_lightning.loops.loop_services",
    "fl_lightning.model_state": "fl_lightning.server.model_state",
    "fl_lightning.models.fedmrn": "fl_lightning.models.masked_networks",
    "fl_lightning.participation.base": "fl_lightning.participation.participation_model",
    "fl_lightning.probe": "fl_lightning.evaluation.probe",
    "fl_lightning.schedulers": "fl_lightning.models.schedulers",
    "fl_lightning.services": "fl_lightning.server.services",
    "fl_lightning.update_bounds": "fl_lightning.robust.update_bounds",
}


class _MovedModuleLoader(importlib.abc.Loader):
    def __init__(self, new: str) -> None:
        self._new = new
        self._spec: importlib.machinery.ModuleSpec | None = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        warnings.warn(
            f"`{spec.name}` moved to `{self._new}`; import it from there (the old path goes in the next release).",
            DeprecationWarning,
            stacklevel=2,
        )
        module = importlib.import_module(self._new)
        self._spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: the module is the one already imported at its new path. The import system has
        just set its ``__spec__`` to the old path's; the module keeps its own."""
        module.__spec__ = self._spec


class _MovedModuleFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: object = None, target: object = None) -> importlib.machinery.ModuleSpec | None:
        new = MOVED.get(fullname)
        return None if new is None else importlib.machinery.ModuleSpec(fullname, _MovedModuleLoader(new))


def install() -> None:
    """Lets the old paths import (once per process)."""
    if not any(isinstance(finder, _MovedModuleFinder) for finder in sys.meta_path):
        sys.meta_path.append(_MovedModuleFinder())
