"""pfl-research 0.6.0's own simulator side by side with FederatedTrainer's executors on pfl's CIFAR-10 IID set-up.

The set-up is ``pfl_cifar10.py``'s (1000 clients x 50 synthetic CIFAR-10-shaped images, batch 10, 1 local epoch of
SGD at lr 0.1, FedAvg at central lr 1, pfl's ``simple_cnn``), at each ``--per-round`` cohort size. Per repeat the
ways run one after another at the same load: the plain PyTorch loop, each of ``--executors``, and pfl's simulator
(``pfl_simulator.py``, in a subprocess started with ``--pfl-python``: pfl lives in its own environment). Every
way times its own rounds on its own process's CPU clock (``--clock``), after ``--warmup`` rounds; clients/s are
reported with their ratio to the plain loop of the same repeats.

What the compared work is, and what differs:

- the same: per client 5 SGD steps of batch 10 on 50 images through the same 1.6 M-parameter CNN (Xavier-uniform
  weights, dropout on), weights loaded before and the delta taken after, one FedAvg step per round, 1 torch
  thread, no evaluation in the timed rounds (pfl's ``evaluation_frequency`` is set to the run's length, so only
  its first, warm-up round evaluates, and no central evaluation is attached);
- pfl draws each cohort member with replacement (its ``random`` user sampler; the library and the plain loop draw
  without replacement per round) and reads each user's images in a fixed order (here shuffled per round): the
  same amount of work per client either way;
- pfl's model takes channels-last ``[N, H, W, C]`` images and transposes them in its first layer (so its
  convolutions see channels-last strides); ``PflCNN`` takes ``[N, C, H, W]``;
- pfl computes its own per-round metrics (loss, weights, number of data points) on the way.

``--pfl-evaluate`` adds a row of pfl with its benchmark's evaluation schedule kept (every 10th round: each trained
user evaluated before and after training, and a central evaluation of 10,000 images), over ``--warmup`` + 10
rounds, so that one evaluation round falls in the timed ten: what the schedule costs on top of training.

Without ``--pfl-python`` (or when that Python cannot import pfl) the script prints one ``SKIP`` line and exits 0.

Run from the repository root::

    python3 -m venv /work/venv-pfl && /work/venv-pfl/bin/pip install 'pfl[pytorch]==0.6.0' 'torch==2.15.0'
    PYTHONPATH=. python benchmarks/pfl_side_by_side.py --pfl-python /work/venv-pfl/bin/python
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
from harness import CLOCKS  # benchmarks/ is on sys.path
from pfl_cifar10 import Row, make_workload, quiet, run_federated, run_plain
from reporting import emit, header, load, mean_std

SIMULATOR = Path(__file__).with_name("pfl_simulator.py")
EVALUATED_ROUNDS = 10  # pfl's evaluation_frequency in its baseline.yaml


def pfl_missing(python: str | None) -> str | None:
    """Why pfl's simulator cannot run (``None`` when it can)."""
    if python is None:
        return "no --pfl-python given"
    try:
        probe = subprocess.run([python, "-c", "import pfl, torch"], capture_output=True, text=True, check=False)
    except OSError as error:
        return f"--pfl-python {python!r} cannot be started ({error})"
    if probe.returncode != 0:
        return f"--pfl-python {python!r} cannot import pfl and torch: {probe.stderr.strip().splitlines()[-1]}"
    return None


def run_pfl(python: str, args: argparse.Namespace, per_round: int, rounds: int, evaluate: bool) -> tuple[np.ndarray, dict]:
    """pfl's seconds (wall, CPU) per round of a run of ``rounds`` rounds, and what it says about itself."""
    command = [
        python, str(SIMULATOR), "--users", str(args.clients), "--cohort", str(per_round), "--rounds", str(rounds),
        "--threads", str(args.threads), *(["--evaluate"] if evaluate else []),
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"pfl's simulator exited with {done.returncode}: {done.stderr[-2000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return np.asarray(result["rounds"]), result


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def bench(args: argparse.Namespace, per_round: int) -> tuple[dict[str, Row], dict, str]:
    """The rows at one cohort size, pfl's description of itself, and the load averages before -> after."""
    before = load()
    work = make_workload(argparse.Namespace(**{**vars(args), "per_round": per_round}))
    total = args.warmup + args.rounds
    rows = {"plain": Row("plain PyTorch loop"), **{e: Row(f"FederatedTrainer `{e}`") for e in args.executors}}
    rows["pfl"] = Row("pfl-research 0.6.0 simulator (training only)")
    about: dict = {}
    for rep in range(args.repeats):
        log(f"{per_round}/round, repeat {rep + 1}/{args.repeats}: plain loop")
        rows["plain"].add(run_plain(work, total)[0], args.warmup, per_round)
        for executor in args.executors:
            log(f"{per_round}/round, repeat {rep + 1}/{args.repeats}: {executor}")
            rows[executor].add(run_federated(work, total, executor)[0], args.warmup, per_round)
        log(f"{per_round}/round, repeat {rep + 1}/{args.repeats}: pfl")
        times, about = run_pfl(args.pfl_python, args, per_round, total, evaluate=False)
        rows["pfl"].add(times, args.warmup, per_round)
    if args.pfl_evaluate:
        log(f"{per_round}/round: pfl with its evaluation schedule")
        row = rows["pfl-evaluate"] = Row(f"pfl-research 0.6.0 simulator, evaluation every {EVALUATED_ROUNDS}th round")
        row.add(
            run_pfl(args.pfl_python, args, per_round, args.warmup + EVALUATED_ROUNDS, evaluate=True)[0], args.warmup, per_round
        )
    return rows, about, f"{before} -> {load()}"


def render(results: dict[int, tuple[dict[str, Row], dict, str]], args: argparse.Namespace, head: list[str]) -> str:
    clock = args.clock
    cohorts = list(results)
    about = next(iter(results.values()))[1]
    out = [
        "## pfl-research's simulator side by side (pfl's CIFAR-10 IID set-up, CPU)",
        "",
        *head,
        f"- pfl {about.get('pfl')} with torch {about.get('torch')} ({about.get('threads')} thread) in its own environment",
        f"- {args.clients} clients x 50 synthetic images; {args.warmup} warm-up + {args.rounds} timed rounds per run x "
        f"{args.repeats} repeats, ways interleaved; clients/s on the **{clock}** clock, mean ± std over repeats",
        "- load averages (1, 5, 15 min) before -> after: " + "; ".join(f"{k}/round {results[k][2]}" for k in cohorts),
        "",
        "| way | " + " | ".join(f"{k}/round clients/s | vs plain" for k in cohorts) + " |",
        "|---|" + "---:|---:|" * len(cohorts),
    ]
    for key in results[cohorts[0]][0]:
        cells = []
        for k in cohorts:
            rows = results[k][0]
            rates, base = rows[key].rates[clock], float(np.mean(rows["plain"].rates[clock]))
            cells.append(f"{mean_std(rates, 1)} | {float(np.mean(rates)) / base:.2f}x")
        out.append(f"| {results[cohorts[0]][0][key].label} | " + " | ".join(cells) + " |")
    return "\n".join([*out, ""])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pfl-python", help="the Python of an environment with pfl[pytorch]==0.6.0")
    parser.add_argument("--per-round", type=int, nargs="+", default=[10, 50], help="cohort sizes")
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=2, help="timed rounds per run")
    parser.add_argument("--warmup", type=int, default=1, help="untimed rounds per run (>= 1: pfl always evaluates its first)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--executors", default="lightning,lean,batched", help="FederatedTrainer client executors")
    parser.add_argument("--pfl-evaluate", action="store_true", help="add pfl with its evaluation schedule")
    parser.add_argument("--threads", type=int, default=1, help="torch threads, here and in pfl's process")
    parser.add_argument("--clock", choices=CLOCKS, default="cpu")
    parser.add_argument("--out", help="also write the Markdown report to this file")
    args = parser.parse_args(argv)
    for name in ("clients", "rounds", "repeats", "threads", "warmup"):
        if getattr(args, name) < 1:  # pfl's first round evaluates (always): it must be a warm-up round
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if min(args.per_round) < 1 or max(args.per_round) > args.clients:
        parser.error(f"--per-round must lie in 1..--clients ({args.clients}), got {args.per_round}")
    if (why := pfl_missing(args.pfl_python)) is not None:
        print(f"SKIP: pfl-research side by side not run: {why}")
        return
    args.executors = [e.strip() for e in args.executors.split(",") if e.strip()]
    args.device, args.data_on, args.data_root = "cpu", "device", None  # the workload of pfl_cifar10.py on the CPU
    torch.set_num_threads(args.threads)
    quiet()
    started, load_before = time.perf_counter(), load()
    results = {k: bench(args, k) for k in args.per_round}
    emit(render(results, args, header(started, load_before, threads=torch.get_num_threads())), args.out)


if __name__ == "__main__":
    main()
