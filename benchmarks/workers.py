"""Worker processes for the paper-reproduction benchmarks: one run per task, quiet, single-threaded."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
import warnings
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context


def quiet() -> None:
    """Silences warnings and Lightning's info logs (each run would print its own banner)."""
    warnings.filterwarnings("ignore")
    for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)


def init_worker(threads: int, parent: int | None = None) -> None:
    """``threads`` torch threads (0 keeps torch's default) and quiet logs; with ``parent``, the
    worker also exits on SIGTERM and when that process dies."""
    import torch

    if threads > 0:
        torch.set_num_threads(threads)
    quiet()
    if parent is None:
        return
    # Lightning turns SIGTERM into an exception that the pool hands back as the run's result, and
    # the worker then takes the next run; `kill` should stop the worker instead. Lightning keeps
    # this handler and calls it after its own.
    signal.signal(signal.SIGTERM, lambda signum, frame: os._exit(128 + signum))

    # A worker whose parent died (killed) would otherwise finish its queued runs for nobody. The
    # parent's pid comes from the parent: it may be dead (and this worker re-parented) by now.
    def watch_parent() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch_parent, daemon=True).start()


def worker_pool(jobs: int, threads: int) -> ProcessPoolExecutor:
    """``jobs`` spawned workers set up by :func:`init_worker`, tied to this process."""
    return ProcessPoolExecutor(jobs, mp_context=get_context("spawn"), initializer=init_worker, initargs=(threads, os.getpid()))
