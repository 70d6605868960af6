"""The package's layout: no import circle and one file name per concept (issue 31)."""

from __future__ import annotations

import ast
from collections import Counter
from collections.abc import Collection
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "fl_lightning"
#: File names that every package has by convention, not a concept.
CONVENTIONAL = {"__init__.py", "__main__.py"}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST, module: str, is_package: bool, modules: Collection[str]) -> set[str]:
    """The ``modules`` named by ``tree``'s imports, at any depth, except under ``if TYPE_CHECKING:``.

    ``from package import name`` depends on the submodule ``package.name`` where there is one, and
    on ``package`` itself (its ``__init__``) otherwise.
    """
    found: set[str] = set()
    pending: list[ast.AST] = [tree]
    while pending:
        node = pending.pop()
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            pending.extend(node.orelse)
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                package = module.split(".") if is_package else module.split(".")[:-1]
                base = ".".join(package[: len(package) - node.level + 1])
                source = f"{base}.{node.module}" if node.module else base
            else:
                source = node.module or ""
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                found.add(submodule if submodule in modules else source)
        pending.extend(ast.iter_child_nodes(node))
    return found


def import_graph() -> dict[str, set[str]]:
    """Each fl_lightning module and the fl_lightning modules it imports at run time."""
    files = {_module_name(path): path for path in PACKAGE.rglob("*.py")}
    graph = {}
    for module, path in files.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        imported = _imports(tree, module, path.name == "__init__.py", files)
        graph[module] = {m for m in imported if m in files and m != module}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path ``[a, b, ..., a]``, or ``None`` (iterative depth-first search)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for root in sorted(graph):
        if root in state:
            continue
        path, stack = [root], [iter(sorted(graph[root]))]
        state[root] = 1
        while stack:
            child = next(stack[-1], None)
            if child is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(child) == 1:
                return path[path.index(child) :] + [child]
            elif child not in state:
                state[child] = 1
                path.append(child)
                stack.append(iter(sorted(graph[child])))
    return None


def test_find_cycle_names_a_cycle_and_accepts_a_tree() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_imports_resolve_relative_and_skip_type_checking() -> None:
    source = "from typing import TYPE_CHECKING\nfrom . import x\nfrom .y import z\nif TYPE_CHECKING:\n    import q\n"
    found = _imports(ast.parse(source), "pkg.sub.mod", is_package=False, modules={"pkg.sub.x", "pkg.sub.y"})
    assert found == {"typing", "pkg.sub.x", "pkg.sub.y"}


def test_the_package_has_no_import_cycle() -> None:
    graph = import_graph()
    assert len(graph) > 100, "the walk found too few modules"
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_no_two_modules_share_a_file_name() -> None:
    names = Counter(path.name for path in PACKAGE.rglob("*.py") if path.name not in CONVENTIONAL)
    shared = {name: sorted(str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob(name)) for name, n in names.items() if n > 1}
    assert not shared, f"file names used by more than one module: {shared}"
