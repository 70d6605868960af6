"""The folder a client store spills to, and the sweep that removes those a killed process left.

A store's spill folder (``client_state-*``) is made in the experiment's folder, which every run of the
experiment shares (a resumed run included), and holds a ``.lock`` file that its process keeps locked
(``flock``) while it lives. The kernel releases that lock however the process ends, SIGKILL and OOM
kill included, so a folder whose lock can be taken belongs to no live process: the next fit's start-up
sweep (:func:`sweep_orphan_spill_folders`) deletes it. Process ids are not used: a restarted container
reuses them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time

try:
    import fcntl
except ImportError:  # Windows: no flock; a folder is then removed with its store only
    fcntl = None  # type: ignore[assignment]

PREFIX = "client_state-"
_LOCK = ".lock"
#: A folder without a lock file is an orphan once older than this (a kill between making it and locking it).
_UNLOCKED_GRACE_S = 60.0


def make_spill_folder(parent: str | None) -> tuple[str, int | None]:
    """A new ``client_state-*`` folder in ``parent`` (the system's temporary folder when ``None``) and the
    descriptor of its held lock (``None`` without ``flock``): close it, then delete the folder, to release it."""
    if parent is not None:
        os.makedirs(parent, exist_ok=True)
    folder = tempfile.mkdtemp(prefix=PREFIX, dir=parent)
    if fcntl is None:
        return folder, None
    descriptor = os.open(os.path.join(folder, _LOCK), os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return folder, descriptor


def release_spill_folder(folder: str, descriptor: int | None) -> None:
    """Deletes ``folder`` and releases its lock (the store's finaliser)."""
    shutil.rmtree(folder, ignore_errors=True)
    if descriptor is not None:
        with contextlib.suppress(OSError):
            os.close(descriptor)


def sweep_orphan_spill_folders(parent: str) -> list[str]:
    """Deletes the ``client_state-*`` folders in ``parent`` that no live process holds; returns their paths."""
    if fcntl is None:
        return []
    removed = []
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        for name in sorted(os.listdir(parent)):
            folder = os.path.join(parent, name)
            if name.startswith(PREFIX) and os.path.isdir(folder) and _orphaned(folder):
                shutil.rmtree(folder, ignore_errors=True)
                removed.append(folder)
    return removed


def _orphaned(folder: str) -> bool:
    try:
        descriptor = os.open(os.path.join(folder, _LOCK), os.O_RDWR)
    except FileNotFoundError:
        return time.time() - os.path.getmtime(folder) > _UNLOCKED_GRACE_S
    except OSError:
        return False  # unreadable: not ours to judge
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False  # a live process holds it
    finally:
        os.close(descriptor)  # also releases the lock just taken
    return True
