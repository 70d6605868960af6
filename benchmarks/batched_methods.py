"""Clients per second of the batched executor next to the lean one for the methods it batches beyond FedAvg.

Workload: the digits federation (scikit-learn's 1,437 training digits over 100 clients by Dirichlet(0.5), 64
features), MLP 64-64-10, plain SGD (lr 0.05), one local epoch of batch 10, ``--clients`` clients per round;
FedProx (mu 0.01), SCAFFOLD, FedNova (unequal steps from unequal clients), FedPer (the output layer local: each
client's own row, from and back to the client store), Ditto (lambda 0.1: under the batched executor a group's personal passes
train as one group after its global passes), FedMRN (binary masks over uniform noise, on the same MLP with
its Linear weights masked: ``MaskedMLP``) and FedSoft (2 clusters, lambda 0.1: each client's proximal pull towards
its own mix of the centres; it picks ``--clients`` / 2 clients per cluster, and a client two clusters pick trains
once, so its clients/s count picks: read its ratio). Each repeat runs every (method, executor) pair once, interleaved, in one process
(so the machine's load hits them alike): ``--warmup`` rounds, then ``--rounds`` measured ones. Reported: clients
per second = clients per round / the median round's process CPU time (the wall clock beside it), the batched
executor's over the lean one's from the same repeat, and the largest weight difference between the two runs' final
models (they train the same clients on the same batches).

Run from the repository root::

    PYTHONPATH=. python benchmarks/batched_methods.py                  # ~3 min on 2 loaded CPU cores
    PYTHONPATH=. python benchmarks/batched_methods.py --repeats 1 --rounds 3   # smoke run
    PYTHONPATH=. python benchmarks/batched_methods.py --methods FedMRN --clients 10,50
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time
import warnings
from collections.abc import Callable

import numpy as np
import torch
from harness import QUIET_TRAINER, RoundTimer, max_abs_diff  # benchmarks/ is on sys.path as a script
from reporting import emit, header, load

from fl_lightning import SCAFFOLD, Ditto, FederatedTrainer, FedMRN, FedNova, FedPer, FedProx, FedSoft
from fl_lightning.algorithms.shared.algorithm import Algorithm
from fl_lightning.data import Dirichlet, FederatedDataModule
from fl_lightning.data.datasets.digits import Digits
from fl_lightning.models import MLP
from fl_lightning.models.masked_networks import MaskedMLP

#: Each method for a number of clients per round.
METHODS: dict[str, Callable[[int], Algorithm]] = {
    "FedProx (mu 0.01)": lambda clients: FedProx(mu=0.01),
    "SCAFFOLD": lambda clients: SCAFFOLD(),
    "FedNova": lambda clients: FedNova(),
    "FedPer (net.3 local)": lambda clients: FedPer(personal=["net.3"]),
    "Ditto (lambda 0.1)": lambda clients: Ditto(lam=0.1),
    "FedMRN": lambda clients: FedMRN(),
    "FedSoft (S=2 lambda 0.1)": lambda clients: FedSoft(num_clusters=2, clients_per_cluster=clients // 2, lam=0.1),
}
#: The methods whose clients train a model other than the plain MLP (the same layers).
MODELS: dict[str, type[MLP]] = {"FedMRN": MaskedMLP}
EXECUTORS = ("lean", "batched")


def run(method: str, executor: str, clients: int, rounds: int) -> tuple[np.ndarray, dict[str, torch.Tensor]]:
    """One fit; returns each round's (wall, CPU) seconds and the final weights."""
    torch.manual_seed(0)
    model = MODELS.get(method, MLP)(in_features=64, hidden=(64,), num_classes=10, lr=0.05)
    data = FederatedDataModule(Digits(), partitioner=Dirichlet(alpha=0.5), num_clients=100, batch_size=10, seed=0)
    timer = RoundTimer()
    trainer = FederatedTrainer(
        **QUIET_TRAINER, algorithm=METHODS[method](clients), clients_per_round=clients, max_epochs=rounds, local_epochs=1,
        client_executor=executor, callbacks=[timer], seed=0,
    )
    trainer.fit(model, datamodule=data)
    return np.diff(np.stack(timer.marks), axis=0), {k: v.detach().clone() for k, v in model.state_dict().items()}


def measure(method: str, clients: int, warmup: int, rounds: int) -> str:
    """Both executors' runs of ``method``, one after the other: the table's measured cells."""
    speeds, weights = {}, {}
    for executor in EXECUTORS:
        times, weights[executor] = run(method, executor, clients, warmup + rounds)
        wall, cpu = (statistics.median(times[warmup:, i]) for i in (0, 1))
        speeds[executor] = (clients / cpu, clients / wall)
    (lean_cpu, lean_wall), (batched_cpu, batched_wall) = speeds["lean"], speeds["batched"]
    return (
        f"{lean_cpu:.0f} ({lean_wall:.0f}) | {batched_cpu:.0f} ({batched_wall:.0f}) "
        f"| {batched_cpu / lean_cpu:.2f}x ({batched_wall / lean_wall:.2f}x) "
        f"| {max_abs_diff(weights['batched'], weights['lean']):.1e}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", default="50", help="clients per round, or several comma-separated (one table each)")
    parser.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated, among: {', '.join(METHODS)}")
    parser.add_argument("--warmup", type=int, default=3, help="rounds not measured, first")
    parser.add_argument("--rounds", type=int, default=10, help="rounds measured")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", help="write the Markdown report here too")
    args = parser.parse_args()
    torch.set_num_threads(1)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    methods = args.methods.split(",")
    unknown = sorted(set(methods) - set(METHODS))
    if unknown:
        parser.error(f"--methods: unknown {unknown}; allowed: {', '.join(METHODS)}")
    started, load_before = time.perf_counter(), load()
    rows = [
        f"| {clients} | {repeat + 1} | {method} | {measure(method, clients, args.warmup, args.rounds)} |"
        for clients in (int(c) for c in args.clients.split(",")) for repeat in range(args.repeats) for method in methods
    ]
    report = [
        f"# Batched vs lean per method, {args.clients} clients per round",
        "",
        *header(started, load_before, threads=1),
        f"- {args.warmup} warm-up + {args.rounds} measured rounds per run, {args.repeats} interleaved repeats",
        "",
        "| clients/round | repeat | method | lean clients/s, CPU (wall) | batched clients/s, CPU (wall) | batched / lean "
        "| max weight diff |",
        "|---:|---|---|---:|---:|---:|---:|",
        *rows,
    ]
    emit("\n".join(report), args.out)


if __name__ == "__main__":
    main()
