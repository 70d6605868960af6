"""A package's public names imported from their modules on first access (PEP 562), so that importing a package
imports none of its modules until a name is read: ``import fl_lightning`` loads neither the algorithms nor Lightning,
and ``from fl_lightning.data import Dirichlet`` loads the partitioners, not every dataset."""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
import sys
from pathlib import Path
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any


def lazy_exports(
    package: str, exports: Mapping[str, Sequence[str]]
) -> tuple[list[str], Callable[[str], Any], Callable[[], list[str]]]:
    """``(__all__, __getattr__, __dir__)`` for ``package`` (its ``__name__``), whose public names are ``exports``
    (defining module -> names). A name read is imported from its module and kept as the package's attribute; a
    submodule's name (``fl_lightning.data.datasets``) imports the submodule, as an eager ``__init__`` would have."""
    module_of = {name: module for module, names in exports.items() for name in names}
    namespace = sys.modules[package].__dict__

    def __getattr__(name: str) -> Any:
        if name in module_of:
            value = getattr(importlib.import_module(module_of[name]), name)
        elif not name.startswith("_") and name in {info.name for info in pkgutil.iter_modules(namespace["__path__"])}:
            value = importlib.import_module(f"{package}.{name}")
        else:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *module_of})

    return sorted(module_of), __getattr__, __dir__


def public_names(package: str = "fl_lightning") -> Iterator[tuple[str, str]]:
    """``(package, name)`` for every public name of ``package``, then of its subpackages made lazy by
    :func:`lazy_exports`, depth first (their ``__all__``: nothing but the packages is imported)."""
    module = importlib.import_module(package)
    yield from ((package, name) for name in getattr(module, "__all__", ()))
    for info in pkgutil.iter_modules(getattr(module, "__path__", ())):
        if info.ispkg and not info.name.startswith("_") and _is_lazy(f"{package}.{info.name}"):
            yield from public_names(f"{package}.{info.name}")


def import_every_export(package: str = "fl_lightning") -> None:
    """Imports every public name of ``package`` and of its subpackages made lazy by :func:`lazy_exports`, as eager
    ``__init__``\\ s did. The CLI needs this: jsonargparse resolves a short ``class_path`` (``QFedAvg``) among the
    subclasses already imported."""
    for owner, name in public_names(package):
        getattr(sys.modules[owner], name)


def _is_lazy(package: str) -> bool:
    """Whether ``package``'s ``__init__`` exports its names through :func:`lazy_exports` (read without importing)."""
    spec = importlib.util.find_spec(package)
    return bool(spec and spec.origin and "lazy_exports(" in Path(spec.origin).read_text())
