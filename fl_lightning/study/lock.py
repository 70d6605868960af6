"""An exclusive claim on a run folder, so that no two processes run the same run at once.

The claim is an ``flock`` on ``<run>/run.lock``. The OS drops an ``flock`` when the last process
holding it exits, however it exits, so a lock left by a killed study is never stale: its file
stays, naming the dead holder, and the next study takes it over. The run's own process inherits
the lock (:attr:`RunLock.fd`), so the run stays claimed while that process lives, even after
its study is gone.

The file is never deleted (deleting a lock file while another process waits to open it would let
two processes lock two different files); the last holder to release it empties it instead, so a
file that still names a holder when it is acquired was left by a process that died holding it.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
from datetime import datetime, timezone
from pathlib import Path
from typing import Any


class RunLocked(RuntimeError):
    """Another live process holds the run's lock."""


class RunLock:
    """An exclusive, non-blocking claim on one run folder.

    Args:
        path: The lock file, ``<run>/run.lock``; created if missing, never deleted.
        name: The run's name (``<arm>/seed_<seed>``), for messages.
    """

    def __init__(self, path: Path, name: str) -> None:
        self.path = path
        self.name = name
        self._fd: int | None = None
        self._holder: dict[str, Any] = {}
        self.taken_over: dict[str, Any] | None = None

    @property
    def fd(self) -> int:
        """The locked file's descriptor, for the run's process to inherit (``pass_fds``)."""
        if self._fd is None:
            raise RuntimeError(f"the lock of run {self.name} is not held.")
        return self._fd

    def acquire(self) -> None:
        """Claims the run, or raises :class:`RunLocked` naming the process that holds it.

        Sets :attr:`taken_over` to what the file said of a holder that died without releasing it.
        """
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise RunLocked(
                f"run {self.name} is already running, locked by {describe(read_holder(self.path))}: {self.path}. "
                "Wait for it to finish, or stop that process, then run the study again."
            ) from None
        except OSError as err:  # e.g. ENOLCK: a network file system without locks
            os.close(fd)
            raise OSError(err.errno, f"cannot lock {self.path} for run {self.name}: {err.strerror}") from err
        self._fd = fd
        self.taken_over = read_holder(self.path) or None
        self._holder = {"pid": os.getpid(), "host": socket.gethostname(), "since": _now()}
        self._write()

    def record_child(self, pid: int) -> None:
        """Names the run's process (which inherits the lock) in the lock file, beside the study's."""
        self._holder["child"] = pid
        self._write()

    def release(self) -> None:
        """Drops this process's hold; empties the file unless the run's process lives on, holding the lock."""
        if self._fd is None:
            return
        child = self._holder.get("child")
        if child is None or not _alive(child):
            os.ftruncate(self._fd, 0)
        os.close(self._fd)  # closing the last descriptor of the file drops the flock
        self._fd = None

    def _write(self) -> None:
        data = json.dumps(self._holder).encode()
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, data, 0)


def read_holder(path: Path) -> dict[str, Any]:
    """What the lock file says of its holder: ``pid``, ``host``, ``since`` and maybe ``child``; ``{}`` if nothing."""
    try:
        holder = json.loads(path.read_text())
    except (OSError, ValueError):  # no file, an emptied one, or one read mid-write
        return {}
    return holder if isinstance(holder, dict) else {}


def describe(holder: dict[str, Any]) -> str:
    """The holder in words, e.g. ``process 41 (on node3 since 2026-01-01T10:00:00+00:00) and its run, process 42``."""
    if "pid" not in holder:
        return "another process"
    exited = holder.get("host") == socket.gethostname() and not _alive(holder["pid"])
    text = f"process {holder['pid']} (on {holder.get('host', '?')} since {holder.get('since', '?')}{'; exited' if exited else ''})"
    return text + (f" and its run, process {holder['child']}" if "child" in holder else "")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")
