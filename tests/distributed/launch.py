"""Launching the processes of a distributed test: a clean environment, a free port, a deadline."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def child_env() -> dict[str, str]:
    """This environment, plus the repository on ``PYTHONPATH`` and one thread per process."""
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path}


def run_together(
    commands: Sequence[Sequence[str]],
    *,
    timeout: float,
    cwd: Path | None = None,
) -> list[str]:
    """Runs ``commands`` at the same time and returns their outputs (stdout and stderr).

    Each command runs in a session of its own, which also holds the processes it starts (the
    ranks Lightning's launcher adds). The call returns once every process of every session has
    ended; it fails if a command exits non-zero or if that takes longer than ``timeout`` seconds,
    and then kills them all, so a hang fails the test instead of outliving it.
    """
    env = child_env()
    deadline = time.monotonic() + timeout
    logs = [tempfile.TemporaryFile("w+", errors="replace") for _ in commands]
    procs = [
        subprocess.Popen(list(command), env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        for command, log in zip(commands, logs)
    ]
    timed_out = False
    try:
        for proc in procs:
            proc.wait(timeout=max(deadline - time.monotonic(), 0.0))
        while any(_session_alive(proc.pid) for proc in procs):
            if time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(procs[0].args, timeout)
            time.sleep(0.1)
    except subprocess.TimeoutExpired:
        timed_out = True
    finally:
        for proc in procs:
            _kill_session(proc)
    outputs = []
    for log in logs:
        log.seek(0)
        outputs.append(log.read())
        log.close()
    report = "\n".join(f"$ {' '.join(c)}\n(exit {p.returncode}) ...{_tail(o)}" for c, p, o in zip(commands, procs, outputs))
    assert not timed_out, f"Still running after {timeout} s, killed:\n{report}"
    assert all(proc.returncode == 0 for proc in procs), f"A command failed:\n{report}"
    return outputs


def _tail(output: str, chars: int = 4000) -> str:
    """The end of a launch's output, and before it every line of a rank's traceback (``[rankN]:`` lines) that
    the end leaves out: the rank that failed first is often not the one whose error the output ends with."""
    end = output[-chars:]
    ranks = [line for line in output[:-chars].splitlines() if line.startswith("[rank") and "]:" in line[:10]]
    return "\n".join([*ranks[-60:], end]) if ranks else end


def _session_alive(session: int) -> bool:
    """Whether a process of ``session`` still runs (Linux ``/proc``). Zombies do not count: a
    rank whose launcher ended first is re-parented and may never be reaped in a container."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            state, _ppid, _pgrp, sid = stat.read_text().rsplit(")", 1)[1].split()[:4]
        except (OSError, IndexError):  # the process ended while being read
            continue
        if int(sid) == session and state != "Z":
            return True
    return False


def _kill_session(proc: subprocess.Popen[bytes]) -> None:
    """Ends what is left of ``proc``'s session: SIGTERM first, since a ``torchrun`` agent then
    stops its workers (they run in sessions of their own), SIGKILL after a grace period."""
    for sig, grace in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 0.0)):
        if proc.poll() is not None and not _session_alive(proc.pid):
            break
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
    proc.wait()
