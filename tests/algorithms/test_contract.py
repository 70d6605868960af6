"""Algorithms reach the run only through ``Federation`` and its services, never into the trainer."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import fl_lightning.algorithms as algorithms

PACKAGE = Path(algorithms.__file__).parent
FORBIDDEN_ATTRIBUTES = {"trainer", "_trainer", "fit_loop"}


def trainer_reaches(tree: ast.AST) -> list[str]:
    """Every import of ``_lightning_compat`` and every ``.trainer``/``.fit_loop`` access in ``tree``."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = [a.name for a in node.names] + ([node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
            found += [f"line {node.lineno}: imports {n}" for n in names if "_lightning_compat" in n]
        elif isinstance(node, ast.Attribute) and node.attr in FORBIDDEN_ATTRIBUTES:
            found.append(f"line {node.lineno}: .{node.attr}")
    return found


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_algorithm_touches_the_trainer(path):
    assert trainer_reaches(ast.parse(path.read_text())) == [], f"{path.name} reaches into the trainer"


@pytest.mark.parametrize(
    "source",
    [
        "from fl_lightning import _lightning_compat as compat",
        "import fl_lightning._lightning_compat",
        "x = module.trainer.optimizers",
        "loop = self.federation.module.trainer.fit_loop",
    ],
)
def test_the_check_catches_each_kind_of_reach(source):
    assert trainer_reaches(ast.parse(source))

