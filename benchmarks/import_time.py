"""Start-up cost: what ``import fl_lightning`` (and its CLI) adds on top of ``import lightning.pytorch``.

Each repeat runs a fresh ``python -X importtime -c "import lightning.pytorch; import <module>"`` and reads
the cumulative microseconds of each top-level import from the report; medians over the repeats.

    PYTHONPATH=. python benchmarks/import_time.py --repeats 7
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import time

from benchmarks.reporting import emit, header, load

#: The modules timed, each imported after ``lightning.pytorch`` (which they all need).
MODULES = ("fl_lightning", "fl_lightning.cli", "fl_lightning.study")
_LINE = re.compile(r"import time:\s+\d+ \|\s+(\d+) \| (\S+)$")


def cumulative_ms(module: str) -> dict[str, float]:
    """Cumulative import time (ms) of each top-level module imported by ``import lightning.pytorch; import module``."""
    report = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", f"import torch; import lightning.pytorch; import {module}"],
        capture_output=True, text=True, check=True,
    ).stderr  # fmt: skip
    return {m.group(2): int(m.group(1)) / 1000 for line in report.splitlines() if (m := _LINE.match(line))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", default=None, help="write the report here (default: print)")
    args = parser.parse_args()
    started, load_before = time.perf_counter(), load()
    rows = []
    for module in MODULES:
        runs = [cumulative_ms(module) for _ in range(args.repeats)]
        lightning = statistics.median(r["lightning.pytorch"] for r in runs)
        torch = statistics.median(r["torch"] for r in runs)
        own = statistics.median(r[module] for r in runs)
        rows.append(f"| `import {module}` | {torch:.0f} | {lightning:.0f} | **{own:.0f}** |")
    emit(
        "\n".join(
            [
                *header(started, load_before),
                "",
                f"Median of {args.repeats} fresh processes.",
                "",
                "| after `import torch; import lightning.pytorch` | torch (ms) | lightning.pytorch (ms) | the module itself (ms) |",
                "|---|---:|---:|---:|",
                *rows,
            ]
        ),
        args.out,
    )


if __name__ == "__main__":
    main()
