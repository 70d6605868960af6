"""Where the default executor's extra time per round goes, counted: Python and C function calls per round of
:mod:`executor_pace`'s workload, the plain PyTorch loop beside ``client_executor="auto"``.

Timings of a few microseconds do not resolve one call more or less, and in place, after each client's steps,
every small call runs with cold caches (``results/executor_pace.md``); the count of calls does. A call is a
``sys.setprofile`` ``call`` (Python) or ``c_call`` (C) event; a round's count is the difference between a run of
``2 * rounds`` and one of ``rounds``, so the fit's set-up cancels out. Reported: the totals per round and the
``--top`` functions whose count differs most between the two.

Run from the repository root::

    PYTHONPATH=. python benchmarks/executor_calls.py --out /tmp/executor_calls.md   # ~2 min
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import sysconfig
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

from executor_pace import digits_workload  # benchmarks/ is on sys.path as a script
from overhead import run_federated, run_plain
from reporting import emit, header, load

from fl_lightning.models import MLP


def calls(run: Callable[[int], Any], rounds: int) -> collections.Counter[str]:
    """Calls per round of ``run`` (rounds -> a fit): those of ``2 * rounds`` rounds less those of ``rounds``."""

    def counted(n: int) -> collections.Counter[str]:
        seen: collections.Counter[str] = collections.Counter()

        def profile(frame: FrameType, event: str, arg: Any) -> None:
            if event == "call":
                seen[f"{_where(frame.f_code.co_filename)}:{frame.f_code.co_name}"] += 1
            elif event == "c_call":
                seen[f"C:{getattr(arg, '__qualname__', arg)}"] += 1

        sys.setprofile(profile)
        try:
            run(n)
        finally:
            sys.setprofile(None)
        return seen

    per_round = counted(2 * rounds)
    per_round.subtract(counted(rounds))
    return collections.Counter({k: v / rounds for k, v in per_round.items() if v})


def _where(path: str) -> str:
    """``path`` from its package (site-packages), the repository or the standard library, as shortest."""
    for root in ("site-packages/", os.getcwd() + os.sep, sysconfig.get_paths()["stdlib"] + os.sep):
        path = path.rsplit(root, 1)[-1]
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--out", help="also write the Markdown report to this file")
    args = parser.parse_args()
    started, load_before = time.perf_counter(), load()
    work = digits_workload()
    plain = calls(lambda n: run_plain(work, None, n), args.rounds)
    auto = calls(lambda n: run_federated(work, None, n, MLP, "auto"), args.rounds)

    def total(counts: collections.Counter[str], c: bool) -> float:
        return sum(v for k, v in counts.items() if k.startswith("C:") == c)

    differences = sorted(((auto[k] - plain[k], k) for k in set(plain) | set(auto)), reverse=True)
    lines = header(started, load_before, threads=1)
    lines += [
        "",
        f"Digits FedAvg, 10 clients per round of 5 steps each; calls per round ({args.rounds} rounds counted).",
        "",
        "| | plain loop | auto | auto - plain |",
        "|---|---:|---:|---:|",
        *(
            f"| {kind} calls | {total(plain, c):,.0f} | {total(auto, c):,.0f} | {total(auto, c) - total(plain, c):+,.0f} |"
            for kind, c in (("Python", False), ("C", True))
        ),
        "",
        f"The {args.top} functions called most often more under auto, per round:",
        "",
        "| auto - plain | plain | auto | function |",
        "|---:|---:|---:|---|",
        *(f"| {d:+.0f} | {plain[k]:.0f} | {auto[k]:.0f} | `{k}` |" for d, k in differences[: args.top]),
    ]
    emit("\n".join(lines), args.out)


if __name__ == "__main__":
    main()
