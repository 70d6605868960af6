"""Processes that die with the study that started them, even when it is killed with SIGKILL."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable

_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


def _load_prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # a libc without prctl
        return None


# Resolved here, in the parent: the child, between fork and exec, should only make the call.
_PRCTL = _load_prctl()


def die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` giving the child SIGTERM when its parent dies; ``None`` where Linux's ``prctl`` is missing.

    SIGTERM rather than SIGKILL: a Lightning run stops at its next step and takes its own DDP ranks
    with it. The signal fires when the parent *thread* that started the child exits, so start
    each child from a thread that waits for it. Elsewhere the child outlives a killed study, but
    it keeps its run's lock (:mod:`fl_lightning.study.lock`), so the run is never started twice.
    """
    if _PRCTL is None:
        return None
    prctl = _PRCTL
    parent = os.getpid()

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the call: no signal will come
            os.kill(os.getpid(), signal.SIGTERM)

    return preexec
