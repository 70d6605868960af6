"""Start-up cost of ``fl-lightning --help``: wall and CPU seconds in fresh processes, for this tree and
another (``--before``, e.g. a checkout of main), interleaved so both see the same machine load.

CPU seconds (user + system of the child) are the fairer number on a shared machine: wall time
grows with other people's load, CPU time hardly does. ``import lightning.pytorch`` alone is the floor
that no change to fl_lightning can go below; the last columns time the CLI itself in the same
process, after its imports (building the parsers and printing the help).

    PYTHONPATH=. python benchmarks/help_time.py --before /work/main --repeats 5
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.reporting import emit, header, load

#: The console script (``from fl_lightning.cli import main; main()``), reporting on stderr the CPU
#: seconds that ``main`` itself took after the imports.
CLI = """
import contextlib, io, sys, time
from fl_lightning.cli import main
start = time.process_time()
try:
    with contextlib.redirect_stdout(io.StringIO()):
        main(sys.argv[1:])
except SystemExit:
    pass
print(f"cli {time.process_time() - start}", file=sys.stderr)
"""
#: What each measured process runs.
COMMANDS = {
    "`import lightning.pytorch` (the floor)": ["-c", "import lightning.pytorch"],
    "`fl-lightning --help`": ["-c", CLI, "--help"],
    "`fl-lightning fit --help`": ["-c", CLI, "fit", "--help"],
}


def timed(tree: Path, args: list[str]) -> tuple[float, float, float]:
    """(wall, CPU, the CLI's own CPU) seconds of one fresh ``python args`` with ``tree`` first on the path."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, *args], env={**os.environ, "PYTHONPATH": str(tree)}, capture_output=True, text=True, check=True
    )
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    own = next((float(line.split()[1]) for line in done.stderr.splitlines() if line.startswith("cli ")), float("nan"))
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), own


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", type=Path, required=True, help="the other source tree (e.g. /work/main)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=None, help="write the report here (default: print)")
    args = parser.parse_args()
    started, load_before = time.perf_counter(), load()
    trees = {"before": args.before.resolve(), "after": Path.cwd().resolve()}
    rows = []
    for label, command in COMMANDS.items():
        runs: dict[str, list[tuple[float, float, float]]] = {name: [] for name in trees}
        for _ in range(args.repeats):
            for name, tree in trees.items():
                runs[name].append(timed(tree, command))
        wall, cpu, own = ({name: statistics.median(t[i] for t in r) for name, r in runs.items()} for i in range(3))
        mine = "- | - | -"
        if command[1] == CLI:
            mine = f"{own['before']:.2f} | {own['after']:.2f} | {own['after'] / own['before']:.2f}x"
        rows.append(
            f"| {label} | {wall['before']:.2f} | {wall['after']:.2f} | {cpu['before']:.2f} | {cpu['after']:.2f} | {mine} |"
        )
    emit(
        "\n".join(
            [
                *header(started, load_before),
                "",
                f"Median of {args.repeats} fresh processes per cell, before and after interleaved.",
                "",
                "| command | wall before (s) | wall after (s) | CPU before (s) | CPU after (s) "
                "| the CLI's own CPU before (s) | after (s) | after / before |",
                "|---|---:|---:|---:|---:|---:|---:|---:|",
                *rows,
            ]
        ),
        args.out,
    )


if __name__ == "__main__":
    main()
