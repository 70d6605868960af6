"""Worker processes for the paper-reproduction benchmarks: one run per task, quiet, single-threaded."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from typing import TypeVar

Spec = TypeVar("Spec")
Result = TypeVar("Result")


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


def add_worker_arguments(parser: argparse.ArgumentParser) -> None:
    """``--jobs``, ``--threads`` and ``--out``, as every paper benchmark takes them."""
    parser.add_argument("--jobs", type=int, default=0, help="worker processes (0: the number of CPU cores)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per worker (0: torch's default)")
    parser.add_argument("--out", help="also write the Markdown report to this file")


def run_in_workers(
    run: Callable[[Spec], Result], specs: Sequence[Spec], args: argparse.Namespace, describe: Callable[[Result], str]
) -> list[Result]:
    """Runs every spec in a :func:`worker_pool` of ``args.jobs`` workers (resolved to at most one
    per spec, written back to ``args.jobs`` for the report), printing ``describe(result)`` as each
    arrives; results in the specs' order."""
    args.jobs = min(args.jobs or os.cpu_count() or 1, len(specs))
    print(f"{len(specs)} runs on {args.jobs} worker(s)", flush=True)
    results = []
    with worker_pool(args.jobs, args.threads) as pool:
        for result in pool.map(run, specs):
            print(describe(result), flush=True)
            results.append(result)
    return results
