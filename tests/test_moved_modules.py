"""The old import paths of the modules moved by the relayout (issue 31) still work, with a warning."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from fl_lightning._moved import MOVED


@pytest.mark.parametrize(("old", "new"), sorted(MOVED.items()))
def test_an_old_path_imports_the_moved_module_and_warns_once(old: str, new: str) -> None:
    # A fresh interpreter: in this one the old path may already be imported (the warning comes once).
    code = (
        "import importlib, warnings\n"
        "warnings.simplefilter('always')\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        f"    old = importlib.import_module({old!r})\n"
        f"    again = importlib.import_module({old!r})\n"
        f"assert old is importlib.import_module({new!r}), 'not the moved module'\n"
        "messages = [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)]\n"
        f"assert len(messages) == 1 and {new!r} in messages[0], messages\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr


def test_every_new_path_exists_and_no_old_one_does() -> None:
    if not MOVED:
        pytest.skip("the relayout script has not run on this tree")
    for old, new in MOVED.items():
        assert importlib.util.find_spec(new) is not None, new
        parent = importlib.import_module(old.rsplit(".", 1)[0])
        assert importlib.machinery.PathFinder.find_spec(old, parent.__path__) is None, f"{old} is still a file"
