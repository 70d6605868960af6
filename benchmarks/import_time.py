"""Start-up cost: ``python -X importtime`` of the package's entry points, each module's own time summed by package.

Each repeat runs a fresh ``python -X importtime -c <statement>`` per statement and sums the *self* microseconds of
every imported module by its top-level package (torch, lightning, torchmetrics, torchvision, transformers, ...,
fl_lightning), so the shares add up to the import's total; medians over the repeats. ``--compare DIR`` times the
same statements against another checkout (e.g. main's) in the same repeats, alternating, for a ratio measured side
by side.

    PYTHONPATH=. python benchmarks/import_time.py --repeats 5 --compare /work/main
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from benchmarks.reporting import emit, header, load

#: What a user's script, a Python run and the command line import first.
STATEMENTS = ("import fl_lightning", "from fl_lightning import FederatedTrainer, FedAvg", "import fl_lightning.cli")
#: The packages reported on their own; every other module's time is "other".
PACKAGES = ("torch", "lightning", "torchmetrics", "torchvision", "transformers", "scipy", "matplotlib", "fl_lightning")
_LINE = re.compile(r"import time:\s+(\d+) \|\s+\d+ \| *(\S+)$")


def self_seconds(statement: str, tree: Path) -> Counter[str]:
    """Seconds of each package's own module code in a fresh ``python -c statement`` run in ``tree`` (first on
    ``sys.path``), with ``"modules:fl_lightning"`` the count of our modules imported."""
    report = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", statement], capture_output=True, text=True, check=True, cwd=tree
    ).stderr
    seconds: Counter[str] = Counter()
    for line in report.splitlines():
        if m := _LINE.match(line):
            top = m.group(2).split(".")[0]
            seconds[top if top in PACKAGES else "other"] += int(m.group(1)) / 1e6
            seconds["modules:fl_lightning"] += top == "fl_lightning"
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--compare", type=Path, default=None, help="another checkout timed alongside (e.g. main's)")
    parser.add_argument("--out", default=None, help="write the report here (default: print)")
    args = parser.parse_args()
    started, load_before = time.perf_counter(), load()
    trees = {"this checkout": Path.cwd(), **({f"`{args.compare}`": args.compare} if args.compare else {})}
    runs: dict[tuple[str, str], list[Counter[str]]] = {(s, t): [] for s in STATEMENTS for t in trees}
    for _ in range(args.repeats):
        for statement in STATEMENTS:
            for name, tree in trees.items():  # alternating, so that a load change hits both alike
                runs[statement, name].append(self_seconds(statement, tree))
    columns = [*PACKAGES, "other"]
    rows = []
    for (statement, name), samples in runs.items():
        cells = [statistics.median(s[c] for s in samples) for c in columns]
        total = statistics.median(sum(s[c] for c in columns) for s in samples)
        modules = statistics.median(s["modules:fl_lightning"] for s in samples)
        rows.append(
            f"| `{statement}` | {name} | {total:.2f} | "
            + " | ".join(f"**{v:.3f}**" if c == "fl_lightning" else f"{v:.2f}" for c, v in zip(columns, cells))
            + f" | {modules:.0f} |"
        )
    emit(
        "\n".join([
            *header(started, load_before),
            "",
            f"Median of {args.repeats} fresh processes per cell; seconds of each package's own module code (self time).",
            "",
            f"| statement | checkout | total (s) | {' | '.join(columns)} | our modules |",
            "|---|---|" + "---:|" * (len(columns) + 2),
            *rows,
        ]),
        args.out,
    )


if __name__ == "__main__":
    main()
