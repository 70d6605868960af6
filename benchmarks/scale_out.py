"""Clients per second with 1 and N processes (``strategy="ddp"``): the scale-out of issue 3.

The same FedAvg workload runs once per process count: 200 clients x 50 samples of
MNIST-shaped synthetic data, 20 clients per round, 10 SGD steps of batch 10 per client, MLP
784-200-200-10 (CPU) — each rank trains ``clients[r::N]`` and one all-reduce combines the
round. Clients/s = clients per round / median round wall time over the measured rounds
(the first ``--warmup`` rounds and process start-up excluded). Each process uses
``--threads`` torch threads (default 1), so N processes use N cores.

    PYTHONPATH=. python benchmarks/scale_out.py                       # 1 and 2 CPU processes
    PYTHONPATH=. python benchmarks/scale_out.py --devices 1,2,4 --accelerator gpu   # GPUs (NCCL)

The driver re-runs this script with ``--worker`` once per process count (Lightning's launcher
starts the other ranks); rank 0 writes the round times to a JSON file.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import lightning.pytorch as pl
import torch

from fl_lightning import FedAvg, FederatedCallback, FederatedTrainer
from fl_lightning.data import FederatedDataModule, InMemoryDataset
from fl_lightning.distributed import FederatedDDPStrategy
from fl_lightning.models import MLP
from harness import QUIET_TRAINER  # benchmarks/ is on sys.path when run as a script
from reporting import emit, header, load


class RoundTimes(FederatedCallback):
    """Collects each round's wall time (``round/wall_time_s``) and this rank's time in its clients."""

    def __init__(self) -> None:
        self.seconds: list[float] = []
        self.training: list[float] = []
        self._started = 0.0

    def on_clients_selected(self, trainer, pl_module, round_idx, client_ids) -> None:
        self.training.append(0.0)

    def on_client_start(self, trainer, pl_module, client) -> None:
        self._started = time.perf_counter()

    def on_client_end(self, trainer, pl_module, client, update) -> None:
        self.training[-1] += time.perf_counter() - self._started

    def on_round_aggregated(self, trainer, pl_module, round_idx, metrics) -> None:
        self.seconds.append(metrics["round/wall_time_s"])


def worker(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    n = args.clients * args.samples
    data = FederatedDataModule(
        InMemoryDataset(
            inputs=torch.randn(n, 1, 28, 28, generator=g), labels=torch.randint(0, 10, (n,), generator=g), num_classes=10
        ),
        num_clients=args.clients,
        batch_size=10,
    )
    pl.seed_everything(0, verbose=False)
    times = RoundTimes()
    trainer = FederatedTrainer(
        algorithm=FedAvg(),
        clients_per_round=args.per_round,
        local_steps=args.steps,
        client_executor=args.executor,
        max_epochs=args.warmup + args.rounds,
        accelerator=args.accelerator,
        devices=args.worker,
        strategy=FederatedDDPStrategy(timeout=timedelta(minutes=5)) if args.worker > 1 else "auto",
        callbacks=[times],
        **QUIET_TRAINER,
    )
    trainer.fit(MLP(in_features=784, hidden=(200, 200), lr=0.05), datamodule=data)
    if trainer.global_rank == 0:
        args.result.write_text(
            json.dumps({"round_seconds": times.seconds[args.warmup :], "training_seconds": times.training[args.warmup :]})
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices", default="1,2", help="process counts to compare, e.g. 1,2,4")
    parser.add_argument("--accelerator", default="cpu")
    parser.add_argument("--executor", default="lightning", choices=["lightning", "lean"])
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument("--samples", type=int, default=50)
    parser.add_argument("--per-round", type=int, default=20)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--worker", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--out", help="also write the Markdown table here")
    args = parser.parse_args()
    if args.worker:
        return worker(args)

    rows, started, load_before = [], time.perf_counter(), load()
    with tempfile.TemporaryDirectory() as tmp:
        for devices in (int(d) for d in args.devices.split(",")):
            result = Path(tmp) / f"{devices}.json"
            env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
            # The worker ignores --devices (its count is --worker), so the whole command line passes through.
            cmd = [sys.executable, __file__, *sys.argv[1:], "--worker", str(devices), "--result", str(result)]
            done = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if done.returncode:
                sys.exit(f"{' '.join(cmd)} failed:\n{done.stderr[-4000:]}")
            measured = json.loads(result.read_text())
            seconds = statistics.median(measured["round_seconds"])
            rows.append((devices, seconds, statistics.median(measured["training_seconds"]), args.per_round / seconds))
    base = rows[0][3]
    lines = [
        *header(started, load_before, threads=args.threads, cuda=args.accelerator in ("gpu", "cuda")),
        f"- workload: FedAvg, {args.clients} clients x {args.samples} samples (1x28x28 synthetic), {args.per_round} "
        f"clients/round, {args.steps} SGD steps of batch 10, MLP 784-200-200-10, executor `{args.executor}`, "
        f"{args.threads} torch thread(s) per process; median of {args.rounds} rounds after {args.warmup} warm-up",
        "",
        "| processes | s / round | rank 0 in its clients (s / round) | clients / s | speed-up |",
        "|---:|---:|---:|---:|---:|",
        *(f"| {d} | {s:.3f} | {t:.3f} | {c:.1f} | {c / base:.2f}x |" for d, s, t, c in rows),
    ]
    emit("\n".join(lines), args.out)


if __name__ == "__main__":
    main()
