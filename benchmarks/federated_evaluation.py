"""Cost of federated evaluation: round time with and without ``FederatedEvaluation(every_n_rounds=1)``.

The quickstart workload (``configs/quickstart.yaml``: scikit-learn's digits, 20 clients with
Dirichlet(0.5) label skew, 10 clients per round, 2 local epochs of batch 10, MLP 64-128-10,
FedAvg, server validation every round) with ``holdout_fraction=0.2``, run three ways: without
the evaluation, with a no-op ``FederatedCallback`` (what any callback costs: Lightning calls
its hooks on every local step), and with the evaluation of the global model on all 20 clients'
held-out data after every round. The runs of a repeat alternate in one process, in rotating
order, so that load on a shared machine hits all alike; the result is the ratio.

Reported: median round time of each (all measured rounds of all repeats pooled; a round is one
epoch of ``fit``, validation included), the evaluation's own time per round (timed inside the
callback) as a fraction of the round without it, on the process CPU clock (default; other
processes do not inflate it as much) and the wall clock. Also ``--algorithm ifca`` (each
client's cluster centre scored too) and ``--executor lean``.

Run from the repository root::

    PYTHONPATH=. python benchmarks/federated_evaluation.py            # ~1 min on 2 CPU cores
    PYTHONPATH=. python benchmarks/federated_evaluation.py --quick    # smoke run
    PYTHONPATH=. python benchmarks/federated_evaluation.py --algorithm ifca --executor lean --out eval.md
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time
import warnings
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch
from harness import CLOCKS, QUIET_VALIDATING, RoundTimer, now  # benchmarks/ is on sys.path as a script
from reporting import emit, header, load
from typing_extensions import override

from fl_lightning import IFCA, FedAvg, FederatedCallback, FederatedEvaluation, FederatedTrainer
from fl_lightning.data import Digits, Dirichlet, FederatedDataModule
from fl_lightning.models import MLP

ALGORITHMS = {"fedavg": FedAvg, "ifca": lambda: IFCA(num_clusters=2)}
#: The three ways each repeat runs, in the report's order.
MODES = ("without", "no-op callback", "with")


class TimedEvaluation(FederatedEvaluation):
    """``FederatedEvaluation`` that also records the (wall, CPU) seconds of each evaluation."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.seconds: list[np.ndarray] = []

    @override
    def on_round_aggregated(self, trainer: pl.Trainer, pl_module: pl.LightningModule, round_idx: int, metrics: dict[str, float]) -> None:
        start = now()
        super().on_round_aggregated(trainer, pl_module, round_idx, metrics)
        self.seconds.append(now() - start)


def run(args: argparse.Namespace, mode: str) -> tuple[np.ndarray, np.ndarray]:
    """One fit in ``mode``; returns the (wall, CPU) seconds of each measured round and of each measured evaluation."""
    torch.manual_seed(0)
    data = FederatedDataModule(
        Digits(split="train"),
        Digits(split="test"),
        partitioner=Dirichlet(alpha=0.5),
        num_clients=20,
        batch_size=10,
        holdout_fraction=args.holdout,
        seed=0,
    )
    timer = RoundTimer()
    evaluation = TimedEvaluation(every_n_rounds=1)
    extra = {"without": [], "no-op callback": [FederatedCallback()], "with": [evaluation]}[mode]
    trainer = FederatedTrainer(
        **QUIET_VALIDATING,
        accelerator="cpu",
        algorithm=ALGORITHMS[args.algorithm](),
        max_epochs=args.warmup + args.rounds,
        clients_per_round=10,
        local_epochs=2,
        seed=0,
        client_executor=args.executor,
        callbacks=[timer, *extra],
    )
    trainer.fit(MLP(in_features=64, hidden=(128,), num_classes=10, lr=0.1), datamodule=data)
    rounds = np.diff(np.stack(timer.marks), axis=0)[args.warmup :]
    return rounds, np.stack(evaluation.seconds)[args.warmup :] if mode == "with" else np.zeros((0, 2))


def report(args: argparse.Namespace, results: dict[str, list[tuple[np.ndarray, np.ndarray]]], head: list[str]) -> str:
    clock = CLOCKS.index(args.clock)

    def median(parts: list[np.ndarray], c: int) -> float:
        return float(np.median(np.concatenate([p[:, c] for p in parts])))

    lines = [
        "## Federated evaluation: cost per round (issue 13, item 2)",
        "",
        *head,
        f"- workload: quickstart (digits, 20 clients, Dirichlet(0.5), 10 clients/round, 2 local epochs of batch 10, "
        f"MLP 64-128-10, {args.algorithm}, executor {args.executor}, server validation every round), "
        f"holdout_fraction={args.holdout}; `FederatedEvaluation(every_n_rounds=1)` on all 20 clients; "
        f"{args.warmup} warm-up + {args.rounds} measured rounds x {args.repeats} repeats, runs alternated",
        "",
        "| clock | round without (ms) | with a no-op callback | with evaluation | with / without | evaluation alone (ms) | evaluation / round |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for c, name in enumerate(CLOCKS):
        rounds = {mode: median([r for r, _ in results[mode]], c) for mode in MODES}
        alone = median([e for _, e in results["with"]], c)
        bold = "**" if c == clock else ""
        lines.append(
            f"| {bold}{name}{bold} | {rounds['without'] * 1e3:.1f} | {rounds['no-op callback'] * 1e3:.1f} | "
            f"{rounds['with'] * 1e3:.1f} | {rounds['with'] / rounds['without']:.3f}x | {alone * 1e3:.2f} | "
            f"{alone / rounds['without']:.1%} |"
        )
    per_repeat = [
        float(np.median(e[:, clock]) / np.median(r[:, clock])) for (_, e), (r, _) in zip(results["with"], results["without"])
    ]
    lines += [
        "",
        f"- evaluation / round ({args.clock} clock) per repeat: {', '.join(f'{x:.1%}' for x in per_repeat)} "
        f"(median {statistics.median(per_repeat):.1%}); target: within 10 % of a round",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algorithm", default="fedavg", choices=sorted(ALGORITHMS))
    parser.add_argument("--executor", default="lightning", choices=["lightning", "lean"])
    parser.add_argument("--holdout", type=float, default=0.2, help="holdout_fraction of every client")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--clock", default="cpu", choices=CLOCKS)
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (0: torch's default)")
    parser.add_argument("--quick", action="store_true", help="1 warm-up + 5 rounds x 1 repeat")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    if args.quick:
        args.warmup, args.rounds, args.repeats = 1, 5, 1
    if args.threads:
        torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    started, load_before = time.perf_counter(), load()
    results: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {mode: [] for mode in MODES}
    for repeat in range(args.repeats):
        for i in range(len(MODES)):  # rotated, so no mode always runs first
            mode = MODES[(repeat + i) % len(MODES)]
            results[mode].append(run(args, mode))
    emit(report(args, results, header(started, load_before, threads=torch.get_num_threads())), args.out)


if __name__ == "__main__":
    main()
