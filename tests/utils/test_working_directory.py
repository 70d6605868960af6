"""The console scripts import the user's modules from the working directory, as ``python -m`` does."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

from fl_lightning.utils.working_directory import import_from_working_directory


def test_a_module_in_the_working_directory_becomes_importable_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "my_project_for_cwd_test.py").write_text("VALUE = 3\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("my_project_for_cwd_test")
    import_from_working_directory()
    import_from_working_directory()
    assert sys.path.count(str(tmp_path)) == 1 and sys.path[0] == str(tmp_path)
    assert importlib.import_module("my_project_for_cwd_test").VALUE == 3
    monkeypatch.delitem(sys.modules, "my_project_for_cwd_test")
