"""Peak memory with 100 vs 10,000 clients: is it O(model + one round's updates), whatever the clients?

The same training set (``--samples``, default 100,000 MNIST-shaped synthetic samples, on the
CPU) is split IID among 100 and among 10,000 clients; each configuration trains the same number
of clients per round (``--per-round``), local steps (``--steps``, batch 10) and rounds
(``--rounds``) through ``FederatedTrainer``, in a fresh subprocess so that one run's
allocations cannot hide another's. Algorithms:

- ``fedavg``: :class:`~fl_lightning.FedAvg`;
- ``fedstaleweight``: :class:`~fl_lightning.FedStaleWeight` (asynchronous, per-client staleness
  averages), ``concurrency = --per-round`` clients in flight, buffer of half of them;
- ``fedsoft``: :class:`~fl_lightning.FedSoft` (2 clusters of ``--per-round / 2`` clients; every
  client's personalised model kept in CPU memory; importance estimated over all clients once,
  in round 0, as ``tau = --rounds``);
- ``fedstaleweight-all`` (not in the default list): FedStaleWeight with its default
  concurrency, every client in flight.

Measured, per configuration: on CUDA, ``torch.cuda.max_memory_allocated`` during ``fit`` and its
growth over the memory allocated after set-up (model and optimizer state on the device; the
data stays on the CPU); on CPU, the peak RSS (``resource.getrusage(...).ru_maxrss``) and its
growth over the RSS after set-up (data, datamodule partition, model), plus the RSS after set-up
itself (where the O(clients) partition metadata shows). The table gives the ratios of the
largest client count to the smallest; the claim checked is that the growth stays within 10%.

Run from the repository root::

    PYTHONPATH=. python benchmarks/memory.py                                # CPU, ~5 min on 2 cores
    PYTHONPATH=. python benchmarks/memory.py --device cuda --model cnn      # GPU, PflCNN on CIFAR-shaped data
    PYTHONPATH=. python benchmarks/memory.py --quick                        # smoke run
    PYTHONPATH=. python benchmarks/memory.py --algorithms fedstaleweight-all --clients 100,1000
    PYTHONPATH=. python benchmarks/memory.py --algorithms fedavg --clients 1000 --per-round 50 --executor batched --max-batched-clients 10
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from typing import Any

import torch
from harness import QUIET_TRAINER, on_device  # benchmarks/ is on sys.path when run as a script
from reporting import emit, header, load

MIB = 2**20
ALGORITHMS = ("fedavg", "fedstaleweight", "fedsoft", "fedstaleweight-all")
MODELS = {"mlp": (1, 28, 28), "cnn": (3, 32, 32)}  # input shape of each model's data


def current_rss() -> int:
    """Resident set size of this process now, in bytes."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_rss() -> int:
    """Peak resident set size of this process so far, in bytes (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def make_algorithm(name: str, per_round: int, rounds: int) -> Any:
    from fl_lightning import FedAvg, FedSoft, FedStaleWeight

    if name == "fedavg":
        return FedAvg()
    if name == "fedstaleweight":
        return FedStaleWeight(buffer_size=max(1, per_round // 2), concurrency=per_round)
    if name == "fedstaleweight-all":
        return FedStaleWeight(buffer_size=max(1, per_round // 2))
    if name == "fedsoft":
        return FedSoft(num_clusters=2, clients_per_cluster=max(1, per_round // 2), tau=max(1, rounds), personal_eval_every=0)
    raise ValueError(f"unknown algorithm {name!r}; choose from {ALGORITHMS}")


def client_state_bytes(algorithm: Any) -> int:
    """Bytes of per-client tensors the algorithm keeps in its client stores (FedSoft's personalised models), else 0."""
    return sum(store.nbytes() for store in algorithm.client_stores().values())


def child(args: argparse.Namespace) -> dict[str, Any]:
    """One configuration, in this (fresh) process: set up, measure, fit, measure."""
    from fl_lightning import FederatedTrainer
    from fl_lightning.data import FederatedDataModule, InMemoryDataset
    from fl_lightning.models import MLP, PflCNN

    device = torch.device(args.device)
    g = torch.Generator().manual_seed(1234)
    shape = MODELS[args.model]
    dataset = InMemoryDataset(
        inputs=torch.randn(args.samples, *shape, generator=g),
        labels=torch.randint(0, 10, (args.samples,), generator=g),
        num_classes=10,
    )
    rss_data = current_rss()
    dm = FederatedDataModule(dataset, num_clients=args.num_clients, batch_size=10, seed=0)
    dm.setup("fit")
    torch.manual_seed(0)
    module = MLP(in_features=784, lr=0.05) if args.model == "mlp" else PflCNN(lr=0.1)
    module = module.to(device)
    algorithm = make_algorithm(args.algorithm, args.per_round, args.rounds)
    trainer = FederatedTrainer(
        algorithm=algorithm,
        clients_per_round=args.per_round,
        local_steps=args.steps,
        max_epochs=args.rounds,
        client_executor=args.executor,
        max_batched_clients=args.max_batched_clients,
        **on_device(device),
        **QUIET_TRAINER,
    )
    rss_setup, peak_setup = current_rss(), peak_rss()
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(device)
    cuda_setup = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
    started = time.perf_counter()
    trainer.fit(module, datamodule=dm)
    seconds = time.perf_counter() - started
    loop = trainer.fit_loop
    return {
        "algorithm": args.algorithm,
        "clients": args.num_clients,
        "rss_data": rss_data,
        "rss_setup": rss_setup,
        "peak_setup": peak_setup,
        "peak": peak_rss(),
        "rss_end": current_rss(),
        "cuda_setup": cuda_setup,
        "cuda_peak": torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0,
        "client_state": client_state_bytes(algorithm),
        "history_entries": sum(len(h) for h in loop.history),
        "in_flight": len(getattr(loop, "_in_flight", {})),
        "rounds_done": trainer.current_epoch,
        "seconds": seconds,
    }


def run_config(args: argparse.Namespace, algorithm: str, num_clients: int) -> dict[str, Any]:
    cmd = [
        sys.executable, __file__, "--child",
        "--algorithm", algorithm, "--num-clients", str(num_clients),
        "--device", args.device, "--model", args.model, "--samples", str(args.samples),
        "--per-round", str(args.per_round), "--steps", str(args.steps), "--rounds", str(args.rounds),
        "--executor", args.executor, "--threads", str(args.threads),
        *(["--max-batched-clients", str(args.max_batched_clients)] if args.max_batched_clients else []),
    ]  # fmt: skip
    env = dict(os.environ)
    if args.malloc_mmap_threshold is not None:  # fixed: glibc then serves large blocks by mmap, unmapped on free
        env["MALLOC_MMAP_THRESHOLD_"] = str(args.malloc_mmap_threshold)
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        raise RuntimeError(f"{algorithm} with {num_clients} clients failed:\n{done.stderr[-3000:]}")
    return json.loads(lines[-1])


def mib(x: float) -> str:
    return f"{x / MIB:.1f}"


def render(results: dict[str, list[dict[str, Any]]], args: argparse.Namespace, head: list[str]) -> str:
    cuda = args.device == "cuda"
    out = [
        "## Peak memory: the same data split among few or many clients",
        "",
        *head,
        "",
        "| algorithm | clients | samples / client | RSS after set-up (MiB) | peak RSS (MiB) | RSS growth in fit (MiB) | "
        "RSS at end (MiB) | "
        + ("CUDA peak (MiB) | CUDA growth in fit (MiB) | " if cuda else "")
        + "per-client state (MiB) | fit (s) |",
        "|---|---:|---:|---:|---:|---:|---:|" + ("---:|---:|" if cuda else "") + "---:|---:|",
    ]
    ratios = []
    for name, runs in results.items():
        for r in runs:
            growth = r["peak"] - r["rss_setup"]
            cells = [
                name, f"{r['clients']:,}", f"{args.samples // r['clients']:,}", mib(r["rss_setup"]),
                mib(r["peak"]), mib(growth), mib(r["rss_end"]),
                *([mib(r["cuda_peak"]), mib(r["cuda_peak"] - r["cuda_setup"])] if cuda else []),
                mib(r["client_state"]), f"{r['seconds']:.1f}",
            ]  # fmt: skip
            out.append("| " + " | ".join(cells) + " |")
        small, large = runs[0], runs[-1]
        key, base = ("cuda_peak", "cuda_setup") if cuda else ("peak", "rss_setup")
        growth_ratio = (large[key] - large[base]) / max(1, small[key] - small[base])
        ratios.append((name, small, large, large[key] / small[key], growth_ratio))
    what = "CUDA max_memory_allocated" if cuda else "peak RSS"
    out += ["", f"Ratios, {what}, largest / smallest client count (the claim: within 1.1):", ""]
    for name, small, large, total, growth in ratios:
        setup = (large["rss_setup"] - small["rss_setup"]) / MIB
        verdict = "within 10%" if growth <= 1.1 else "NOT within 10%"
        out.append(
            f"- {name}, {large['clients']:,} / {small['clients']:,} clients: peak {total:.3f}, growth in fit "
            f"{growth:.2f} ({verdict}); RSS after set-up differs by {setup:+.1f} MiB (O(clients) partition metadata)"
        )
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--model", choices=sorted(MODELS), default="mlp", help="mlp: MLP 784-200-200-10; cnn: PflCNN")
    parser.add_argument("--algorithms", default="fedavg,fedstaleweight,fedsoft", help=f"subset of {ALGORITHMS}")
    parser.add_argument("--clients", default="100,10000", help="comma-separated client counts")
    parser.add_argument("--samples", type=int, help="training samples in all (default 100000; quick 20000)")
    parser.add_argument("--per-round", type=int, default=10, help="clients per round (FedSoft: 2 clusters of half)")
    parser.add_argument("--steps", type=int, default=5, help="local SGD steps of batch 10 per client")
    parser.add_argument("--rounds", type=int, help="rounds (aggregations) per run (default 6; quick 2)")
    parser.add_argument("--executor", choices=("lightning", "lean", "batched"), default="lightning")
    parser.add_argument(
        "--max-batched-clients", type=int, help="with --executor batched: at most this many clients trained at once"
    )
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads(N); 0 keeps torch's default")
    parser.add_argument(
        "--malloc-mmap-threshold", type=int, help="set glibc's MALLOC_MMAP_THRESHOLD_ (bytes) in the child processes"
    )
    parser.add_argument("--quick", action="store_true", help="smoke run: 20,000 samples, 100 vs 2,000 clients, 2 rounds")
    parser.add_argument("--out", help="also write the Markdown report to this file")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--algorithm", help=argparse.SUPPRESS)
    parser.add_argument("--num-clients", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.samples is None:
        args.samples = 20_000 if args.quick else 100_000
    if args.rounds is None:
        args.rounds = 2 if args.quick else 6
    if args.quick and args.clients == parser.get_default("clients"):
        args.clients = "100,2000"
    if args.threads > 0:
        torch.set_num_threads(args.threads)

    if args.child:
        import logging
        import warnings

        logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
        warnings.filterwarnings("ignore")
        print(json.dumps(child(args)))
        return

    started, load_before = time.perf_counter(), load()
    counts = sorted(int(c) for c in args.clients.split(","))
    results: dict[str, list[dict[str, Any]]] = {}
    for name in (a.strip() for a in args.algorithms.split(",") if a.strip()):
        for n in counts:
            print(f"{name}, {n} clients ...", file=sys.stderr, flush=True)
            results.setdefault(name, []).append(run_config(args, name, n))
    model = "MLP 784-200-200-10" if args.model == "mlp" else "PflCNN (pfl-research simple_cnn)"
    head = [
        *header(started, load_before, threads=torch.get_num_threads(), cuda=args.device == "cuda"),
        (
            f"- workload: {args.samples:,} synthetic samples of shape {MODELS[args.model]} (CPU tensors), IID; "
            f"{model}; {args.per_round} clients per round, {args.steps} local steps of batch 10, {args.rounds} "
            f"rounds, `client_executor={args.executor!r}`, `max_batched_clients={args.max_batched_clients}`; one fresh process per row"
            + (f"; MALLOC_MMAP_THRESHOLD_={args.malloc_mmap_threshold}" if args.malloc_mmap_threshold is not None else "")
        ),
    ]
    emit(render(results, args, head), args.out)


if __name__ == "__main__":
    main()
