"""Expensive set-up shared by every pytest-xdist worker of a session: made once, by whichever worker asks first."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from filelock import FileLock


def once_per_session(
    tmp_path_factory: pytest.TempPathFactory, worker_id: str, name: str, make: Callable[[Path], None]
) -> tuple[Path, str]:
    """Runs ``make(folder)`` once per session, whichever worker asks first (the others wait on its lock), and returns
    ``folder`` and the failure report, empty when ``make`` succeeded: each test that reads the folder then fails on
    its own, with the report, if what it needs is missing."""
    shared = tmp_path_factory.getbasetemp() if worker_id == "master" else tmp_path_factory.getbasetemp().parent
    folder, report = shared / name, shared / f"{name}.failure"
    with FileLock(shared / f"{name}.lock"):
        if not report.exists():
            try:
                make(folder)
                report.write_text("")
            except Exception as failure:  # noqa: BLE001 - reported by every test that needs what is missing
                report.write_text(f"{type(failure).__name__}: {failure}")
    return folder, report.read_text()
