"""The old import paths of the modules moved by the relayout (issue 31) still work, with a warning."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys

import pytest

from fl_lightning._moved import MOVED

# Run in a fresh interpreter (in this one an old path may be imported already: the warning comes once).
# For each old path: is it the moved module, and the DeprecationWarnings of importing it twice.
_CHECK = """
import importlib, json, sys, warnings
warnings.simplefilter("always")
found = {}
for old, new in json.loads(sys.argv[1]).items():
    with warnings.catch_warnings(record=True) as caught:
        module = importlib.import_module(old)
        importlib.import_module(old)
    found[old] = {
        "same": module is importlib.import_module(new),
        # Only the move's warnings: compiling a module may warn too (an invalid escape in a docstring).
        "warnings": [
            str(w.message) for w in caught if issubclass(w.category, DeprecationWarning) and " moved to " in str(w.message)
        ],
    }
print(json.dumps(found))
"""


def test_each_old_path_imports_the_moved_module_and_warns_once_naming_the_new_one() -> None:
    if not MOVED:
        pytest.skip("the relayout script has not run on this tree")
    result = subprocess.run(
        [sys.executable, "-c", _CHECK, json.dumps(MOVED)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout.splitlines()[-1])
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
