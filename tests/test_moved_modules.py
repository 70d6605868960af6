"""The old import paths of the modules moved by the relayout (issue 31) still work, with a warning."""

from __future__ import annotations

import importlib

import pytest

from fl_lightning._moved import MOVED

def test_each_old_path_imports_the_moved_module_and_warns_once_naming_the_new_one(fresh_process) -> None:
    # In a fresh interpreter (in this one an old path may be imported already: the warning comes once), for each old
    # path: is it the moved module, and the DeprecationWarnings of importing it twice (tests/fresh_process.py).
    if not MOVED:
        pytest.skip("the relayout script has not run on this tree")
    found = fresh_process("moved_modules")
    for old, new in MOVED.items():
        assert found[old]["same"], f"{old} is not {new}"
        assert len(found[old]["warnings"]) == 1 and f"`{new}`" in found[old]["warnings"][0], (old, found[old])


def test_every_new_path_exists_and_no_old_one_does() -> None:
    if not MOVED:
        pytest.skip("the relayout script has not run on this tree")
    for old, new in MOVED.items():
        assert importlib.util.find_spec(new) is not None, new
        parent = importlib.import_module(old.rsplit(".", 1)[0])
        assert importlib.machinery.PathFinder.find_spec(old, parent.__path__) is None, f"{old} is still a file"
