"""The default executor (``client_executor="auto"``) next to the plain PyTorch loop, per round, with garbage collections.

The workload is :mod:`overhead`'s digits FedAvg (MLP 64-64-10, 100 clients of 50 samples, 10 clients per round,
one local epoch of batch 10), ``--rounds`` rounds, the two runs interleaved ``--repeats`` times in one process.
Reported: median process-CPU milliseconds per round over each run's rounds after ``--warmup``, the ratio
auto / plain per repeat and of low percentiles of all repeats' rounds pooled, the full (generation-2) garbage
collections that fell inside the fit and their time, and the load average before and after. ``--no-freeze`` runs the fit without :func:`~fl_lightning.loops.frozen_heap`
(for the side-by-side of its effect); also the seconds of one full collection of the process's heap, unfrozen and
frozen.

Run from the repository root::

    PYTHONPATH=. python benchmarks/executor_pace.py --out benchmarks/results/executor_pace.md
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import logging
import statistics
import time
import warnings
from collections.abc import Iterator
from unittest import mock

import numpy as np
import torch
from overhead import MODELS, Workload, make_workload, run_federated, run_plain  # benchmarks/ is on sys.path as a script
from reporting import emit, header, load

from fl_lightning.models import MLP


class FullCollections:
    """Counts the generation-2 collections and their seconds while installed."""

    def __init__(self) -> None:
        self.count, self.seconds, self._start = 0, 0.0, 0.0

    def __call__(self, phase: str, info: dict) -> None:
        if info["generation"] != 2:
            return
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.count += 1
            self.seconds += time.perf_counter() - self._start

    @contextlib.contextmanager
    def installed(self) -> Iterator[FullCollections]:
        gc.callbacks.append(self)
        try:
            yield self
        finally:
            gc.callbacks.remove(self)


def collection_seconds(*, frozen: bool) -> float:
    """The seconds of one full collection of this process's heap, frozen (as :func:`frozen_heap` leaves it) or not."""
    if frozen:
        gc.freeze()
    try:
        start = time.perf_counter()
        gc.collect()
        return time.perf_counter() - start
    finally:
        if frozen:
            gc.unfreeze()


def pooled_percentiles(plain: list[float], auto: list[float], percents: tuple[int, ...] = (0, 5, 10, 25, 50)) -> list[str]:
    """A table's lines: auto's and plain's percentiles of every repeat's rounds (seconds) pooled, and their ratio."""
    rows = [(q, float(np.percentile(plain, q)) * 1e3, float(np.percentile(auto, q)) * 1e3) for q in percents]
    return [
        "Every repeat's rounds pooled (other processes only slow rounds down: the low percentiles keep each loop's cost):",
        "",
        "| percentile | plain ms/round | auto ms/round | auto / plain |",
        "| --- | --- | --- | --- |",
        *(f"| {q} | {p:.2f} | {a:.2f} | {a / p:.3f}x |" for q, p, a in rows),
    ]


def digits_workload() -> Workload:
    """The workload (digits, MLP 64-64-10, 100 clients of 50 samples, 10 per round), on one torch thread, with
    Lightning's messages and warnings silenced (they would be timed)."""
    torch.set_num_threads(1)
    for name in ("lightning.pytorch", "lightning.fabric", "lightning"):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    return make_workload(MODELS["digits"], num_clients=100, samples_per_client=50, clients_per_round=10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-freeze", action="store_true", help="run the fit without freezing the heap")
    parser.add_argument("--out", help="also write the Markdown report to this file")
    args = parser.parse_args()
    started, load_before = time.perf_counter(), load()
    work = digits_workload()
    freeze = contextlib.nullcontext() if not args.no_freeze else mock.patch("gc.freeze", lambda: None)
    rows, pooled = [], {"plain": [], "auto": []}
    with freeze:
        for repeat in range(args.repeats):
            plain_times, plain_weights = run_plain(work, None, args.rounds)
            with FullCollections().installed() as collections:
                auto_times, auto_weights, _ = run_federated(work, None, args.rounds, MLP, "auto")
            plain, auto = (float(np.median(t[args.warmup :, 1])) * 1e3 for t in (plain_times, auto_times))
            pooled["plain"] += list(plain_times[args.warmup :, 1])
            pooled["auto"] += list(auto_times[args.warmup :, 1])
            diff = max(float((plain_weights[k] - auto_weights[k]).abs().max()) for k in plain_weights)
            rows.append((repeat, plain, auto, auto / plain, collections.count, collections.seconds, diff))
    lines = header(started, load_before, threads=1, cuda=False)
    lines += [
        "",
        f"One full collection after the runs: {collection_seconds(frozen=False):.3f} s over {len(gc.get_objects()):,} tracked "
        f"objects; {collection_seconds(frozen=True):.4f} s with them frozen, as inside a fit.",
        "",
        f"Digits FedAvg, 10 clients per round, {args.rounds} rounds, interleaved; heap frozen: {not args.no_freeze}.",
        "",
        "| repeat | plain ms/round | auto ms/round | auto / plain | full GCs in the fit | their seconds | max weight diff |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    lines += [f"| {r} | {p:.2f} | {a:.2f} | {q:.2f}x | {c} | {s:.3f} | {d:.2g} |" for r, p, a, q, c, s, d in rows]
    lines.append(f"| median | | | {statistics.median(r[3] for r in rows):.2f}x | | | |")
    lines += ["", *pooled_percentiles(pooled["plain"], pooled["auto"])]
    emit("\n".join(lines), args.out)


if __name__ == "__main__":
    main()
