"""What every benchmark prints about the machine it ran on, its mean ± std cells, and where the report goes."""

from __future__ import annotations

import os
import platform
import statistics
from collections.abc import Sequence


def cpu_model() -> str:
    """The CPU model from ``/proc/cpuinfo`` (else what ``platform`` knows)."""
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine() or "unknown"


def machine() -> str:
    """CPU count, CPU model, Python version and OS."""
    return f"{os.cpu_count()} CPU cores (nproc), {cpu_model()}, Python {platform.python_version()}, {platform.system()}"


def load() -> str:
    """The 1, 5 and 15 minute load averages (other work on the machine skews wall times)."""
    try:
        return ", ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


def mean_std(values: Sequence[float], digits: int = 3, scale: float = 1.0) -> str:
    """``mean ± std`` (sample std; 0 for a single value) of ``values * scale``."""
    scaled = [v * scale for v in values]
    std = statistics.stdev(scaled) if len(scaled) > 1 else 0.0
    return f"{statistics.fmean(scaled):.{digits}f} ± {std:.{digits}f}"


def emit(report: str, path: str | None) -> None:
    """Prints the Markdown report and, with ``--out``, also writes it to ``path``."""
    print(report)
    if path:
        with open(path, "w") as f:
            f.write(report.rstrip("\n") + "\n")
