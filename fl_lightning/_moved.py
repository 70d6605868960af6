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
MOVED: dict[str, str] = {}


class _MovedModuleLoader(importlib.abc.Loader):
    def __init__(self, new: str) -> None:
        self._new = new

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        warnings.warn(
            f"`{spec.name}` moved to `{self._new}`; import it from there (the old path goes in the next release).",
            DeprecationWarning,
            stacklevel=2,
        )
        return importlib.import_module(self._new)

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: the module is the one already imported at its new path."""


class _MovedModuleFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: object = None, target: object = None) -> importlib.machinery.ModuleSpec | None:
        new = MOVED.get(fullname)
        return None if new is None else importlib.machinery.ModuleSpec(fullname, _MovedModuleLoader(new))


def install() -> None:
    """Lets the old paths import (once per process)."""
    if not any(isinstance(finder, _MovedModuleFinder) for finder in sys.meta_path):
        sys.meta_path.append(_MovedModuleFinder())
