"""The default executor next to the plain PyTorch loop in machine instructions per round, counted by valgrind's
callgrind: :mod:`executor_pace`'s workload, whose time ratio a shared machine's neighbours move by tens of percent
between repeats, while an instruction count moves by about one percent.

Instructions are not time (cache misses are not in them): ``results/executor_pace.md`` measured the time ratio a few
percent above the instruction ratio. Only the runs are instrumented (``--instr-atstart=no``, a client request before
and after each, through a small C shim compiled here), and a round's count is the difference between a run of
``--high`` rounds and one of ``--low``, so the fit's set-up cancels out.

Needs ``valgrind`` with its headers (``valgrind/callgrind.h``) and a C compiler. Run from the repository root::

    PYTHONPATH=. python benchmarks/executor_instructions.py --out /tmp/executor_instructions.md   # ~3 min
"""

from __future__ import annotations

import argparse
import ctypes
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from reporting import emit, header, load  # benchmarks/ is on sys.path as a script

#: The client requests around each run: counts zeroed and instrumentation on, then off and the counts dumped.
SHIM = """#include <valgrind/callgrind.h>
void start(void) { CALLGRIND_ZERO_STATS; CALLGRIND_START_INSTRUMENTATION; }
void stop(const char *name) { CALLGRIND_STOP_INSTRUMENTATION; CALLGRIND_DUMP_STATS_AT(name); }
"""
RUNS = ("plain", "auto")


def per_round(totals: dict[str, int], low: int, high: int) -> dict[str, float]:
    """Instructions per round of each run from the dumps' totals (``"<run>-<rounds>"`` -> instructions)."""
    return {run: (totals[f"{run}-{high}"] - totals[f"{run}-{low}"]) / (high - low) for run in RUNS}


def dump_totals(paths: list[Path]) -> dict[str, int]:
    """Each callgrind dump's name (the ``stop`` request's) and its total instruction count."""
    totals = {}
    for path in paths:
        text = path.read_text(errors="replace")
        name = re.search(r"^desc: Trigger: Client Request: (\S+)$", text, re.M)
        total = re.search(r"^totals: (\d+)$", text, re.M)
        if name and total:
            totals[name.group(1)] = int(total.group(1))
    return totals


def child(shim: str, low: int, high: int) -> None:
    """Under valgrind: warm both runs up, then each run at ``low`` and at ``high`` rounds, instrumented alone."""
    from executor_pace import digits_workload
    from overhead import run_federated, run_plain

    from fl_lightning.models import MLP

    requests = ctypes.CDLL(shim)
    work = digits_workload()
    fits = {"plain": lambda n: run_plain(work, None, n), "auto": lambda n: run_federated(work, None, n, MLP, "auto")}
    for fit in fits.values():
        fit(2)
    for run, fit in fits.items():
        for rounds in (low, high):
            requests.start()
            fit(rounds)
            requests.stop(f"{run}-{rounds}".encode())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--low", type=int, default=5)
    parser.add_argument("--high", type=int, default=15)
    parser.add_argument("--out", help="also write the Markdown report to this file")
    parser.add_argument("--child", help=argparse.SUPPRESS)  # the shim's path, in the process valgrind runs
    args = parser.parse_args()
    if not 0 < args.low < args.high:
        parser.error(f"need 0 < --low < --high, got --low {args.low} --high {args.high}")
    if args.child:
        child(args.child, args.low, args.high)
        return
    missing = [tool for tool in ("valgrind", "cc") if shutil.which(tool) is None]
    if missing:
        sys.exit(f"executor_instructions needs {' and '.join(missing)} on PATH.")
    started, load_before = time.perf_counter(), load()
    with tempfile.TemporaryDirectory() as scratch:
        source, shim = Path(scratch, "shim.c"), Path(scratch, "shim.so")
        source.write_text(SHIM)
        subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", str(shim), str(source)], check=True)
        # Without address randomisation (setarch -R, where present): hashes of ids, so dict and set probes, repeat.
        fixed_addresses = ["setarch", platform.machine(), "-R"] if shutil.which("setarch") else []
        command = [
            *fixed_addresses, "valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={scratch}/callgrind.%p",
            sys.executable, __file__, "--child", str(shim), "--low", str(args.low), "--high", str(args.high),
        ]
        # A fixed hash seed: set and dict orders, so the counts, do not change between two runs.
        ran = subprocess.run(command, env={**os.environ, "PYTHONHASHSEED": "0"}, capture_output=True, text=True)
        if ran.returncode:
            sys.exit(f"valgrind exited with {ran.returncode}:\n{ran.stderr[-3000:]}")
        counts = per_round(dump_totals(sorted(Path(scratch).glob("callgrind.*"))), args.low, args.high)
    lines = header(started, load_before, threads=1)
    lines += [
        "",
        f"Digits FedAvg, 10 clients per round of 5 steps each; instructions per round ({args.high} - {args.low} rounds).",
        "",
        "| plain loop | auto | auto / plain |",
        "|---:|---:|---:|",
        f"| {counts['plain'] / 1e6:.2f} M | {counts['auto'] / 1e6:.2f} M | {counts['auto'] / counts['plain']:.3f}x |",
    ]
    emit("\n".join(lines), args.out)


if __name__ == "__main__":
    main()
