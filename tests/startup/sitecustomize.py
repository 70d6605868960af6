"""Start-up of the suite's own processes (pytest-xdist workers, torchrun ranks, ``fl-lightning`` and study runs, fresh interpreters): on
``PYTHONPATH`` for them only (:mod:`tests.conftest`), never for a user.

``lightning.pytorch`` imports torchmetrics, whose ``__init__`` imports its image, text and audio metrics whole and,
where they are installed, torchvision's models, transformers, scipy.signal and matplotlib for them: a third of a
process's start-up CPU time (``python -X importtime -c "import fl_lightning.cli"``). While torchmetrics' own modules
run, this tells them those four packages are missing, so they skip those imports. Nothing here uses the metrics
that need them (the suite's models log classification metrics, means and perplexity); the packages stay importable,
and our code that needs one (datasets, LoRA, plots) imports it as before.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from types import ModuleType

SKIPPED = ("torchvision", "transformers", "scipy", "matplotlib")


class _TorchmetricsWithoutOptionalPackages(importlib.abc.MetaPathFinder):
    """Finds ``torchmetrics`` as usual, and runs its ``__init__`` (which imports the rest) with :data:`SKIPPED`
    reported missing to ``lightning_utilities``' availability checks."""

    def find_spec(self, name: str, path: object = None, target: ModuleType | None = None):  # noqa: ANN201
        if name != "torchmetrics":
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name)
        if spec is not None and spec.loader is not None:
            run = spec.loader.exec_module
            spec.loader.exec_module = lambda module: _without_optional_packages(run, module)  # type: ignore[method-assign]
        return spec


def _without_optional_packages(run, module: ModuleType) -> None:  # noqa: ANN001
    from lightning_utilities.core import imports

    available, requirement_met = imports.package_available, imports.RequirementCache.__bool__
    imports.package_available = lambda name: not name.startswith(SKIPPED) and available(name)
    imports.RequirementCache.__bool__ = lambda self: not str(self.requirement).startswith(SKIPPED) and requirement_met(self)
    try:
        run(module)
    finally:
        imports.package_available, imports.RequirementCache.__bool__ = available, requirement_met


sys.meta_path.insert(0, _TorchmetricsWithoutOptionalPackages())
