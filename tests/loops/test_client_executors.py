"""The client executors are one concept that depends on nothing of the loop's."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import fl_lightning.loops as loops

EXECUTOR_MODULES = ("client_executor", "lightning_executor", "lean_executor", "batched_executor", "batched_sgd", "executor_choice")


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    return names | {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}


@pytest.mark.parametrize("module", EXECUTOR_MODULES)
def test_executors_import_no_fit_loop(module: str) -> None:
    """No import circle: the loops import the executors, never the other way round."""
    imported = imported_modules(Path(loops.__file__).parent / f"{module}.py")
    assert not {m for m in imported if m.endswith(("federated_fit_loop", "async_fit_loop"))}, module
