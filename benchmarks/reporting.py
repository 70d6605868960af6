"""What every benchmark prints about the machine it ran on, its mean ± std cells, and where the report goes."""

from __future__ import annotations

import datetime
import math
import os
import platform
import shlex
import statistics
import sys
import time
from collections.abc import Sequence
from importlib.metadata import version


def cpu_model() -> str:
    """The CPU model from ``/proc/cpuinfo`` (else what ``platform`` knows)."""
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine() or "unknown"


def load() -> str:
    """The 1, 5 and 15 minute load averages (other work on the machine skews wall times)."""
    try:
        return ", ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


def header(
    started: float, load_before: str, *, workers: int | None = None, threads: int | None = None, cuda: bool = False
) -> list[str]:
    """The Markdown bullets that open every report: command, date, wall time, machine, versions and load.

    Args:
        started: ``time.perf_counter()`` when the benchmark started (for its wall time).
        load_before: :func:`load` when the benchmark started (the load average after is read now).
        workers: the worker processes the runs were spread over, where the script uses a pool.
        threads: the torch threads of each process that trains.
        cuda: whether the runs used the current CUDA device (its name, memory and CUDA/cuDNN versions are listed).
    """
    parallelism = [f"{workers} worker process(es)"] if workers is not None else []
    if threads is not None:
        parallelism.append(f"{threads} torch thread(s)" + (" each" if workers is not None else ""))
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    lines = [
        f"- command: `python {shlex.join(sys.argv)}`",
        f"- date: {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}; "
        f"wall time {time.perf_counter() - started:.0f} s",
        f"- machine: {os.cpu_count()} CPU cores ({usable} usable), {cpu_model()}, {platform.platform()}",
        f"- python {platform.python_version()}, torch {version('torch')}, lightning {version('lightning')}, "
        f"numpy {version('numpy')}" + "".join(f"; {part}" for part in parallelism),
    ]
    if cuda:
        import torch  # only here: the start-up benchmarks must not pay for importing torch

        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        lines.append(
            f"- device: {props.name}, {props.total_memory / 2**30:.0f} GiB, CUDA {torch.version.cuda}, "
            f"cuDNN {torch.backends.cudnn.version()}"
        )
    return [*lines, f"- load average (1, 5, 15 min) before: {load_before}; after: {load()}"]


def mean_std(values: Sequence[float], digits: int = 3, scale: float = 1.0) -> str:
    """``mean ± std`` (sample std; 0 for a single value) of ``values * scale``."""
    scaled = [v * scale for v in values]
    std = statistics.stdev(scaled) if len(scaled) > 1 else 0.0
    return f"{statistics.fmean(scaled):.{digits}f} ± {std:.{digits}f}"


def significance(differences: Sequence[float]) -> str:
    """The one significance rule of the paper benchmarks' paired rows: the 95 % t-interval of the
    mean paired difference over seeds, and whether it excludes 0 (``yes``) or not (``no``)."""
    from scipy.stats import t as student_t

    n = len(differences)
    if n < 2:
        return "– (1 seed)"
    half = float(student_t.ppf(0.975, n - 1)) * statistics.stdev(differences) / math.sqrt(n)
    mean = statistics.fmean(differences)
    return f"[{mean - half:.3f}, {mean + half:.3f}] {'yes' if abs(mean) > half else 'no'}"


def emit(report: str, path: str | None) -> None:
    """Prints the Markdown report and, with ``--out``, also writes it to ``path``."""
    print(report)
    if path:
        with open(path, "w") as f:
            f.write(report.rstrip("\n") + "\n")
