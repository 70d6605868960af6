"""Waiting on a state (a file written, a process gone), never on the wall clock: the ceiling only turns a hang
into a failure, and is generous enough for a 2-core machine at load 8 (CI runs two suites side by side)."""

from __future__ import annotations

import time
from collections.abc import Callable

#: Seconds before a wait gives up. Nothing is asserted about how long anything took.
CEILING = 600.0


def wait_for(condition: Callable[[], bool], what: str, ceiling: float = CEILING) -> None:
    """Polls ``condition`` until it holds; fails naming ``what`` after ``ceiling`` seconds."""
    deadline = time.monotonic() + ceiling
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {ceiling:.0f} s waiting for {what}"
        time.sleep(0.05)
