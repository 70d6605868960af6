"""Throughput on pfl-research's CIFAR-10 set-up: clients/s and samples/s of FederatedTrainer.

The set-up of pfl-research's CIFAR-10 IID benchmark (apple/pfl-research,
``benchmarks/image_classification/configs/baseline.yaml``): 1000 clients x 50 images, 50
clients per round, batch 10, 1 local epoch (5 SGD steps, lr 0.1, no momentum), FedAvg with
central lr 1, and their ``simple_cnn`` (:class:`fl_lightning.models.PflCNN`, 1.6 M parameters).
The images are CIFAR-10's when ``--data-root`` holds the torchvision copy, else synthetic tensors
of the same shape (throughput does not depend on pixel values).

What it leaves out of pfl's benchmark, so its clients/s are of training alone: pfl's central
evaluation every 10 rounds (about 20 % of pfl's forward work over a run), pfl's user sampling
(with replacement across rounds, by its own sampler) — here clients are drawn without replacement
per round by the library's seeded ``randperm`` — and pfl's fixed per-user sample order (here each
client's batches are shuffled per round by its seeded generator). pfl's own simulator, run in its own
environment beside the plain loop and these executors on pfl's set-up, is ``pfl_side_by_side.py``.

Four ways, side by side:

(a) a plain PyTorch loop (``benchmarks/harness.py``): per client ``param.copy_`` of the
    global weights, a fresh SGD, the steps, ``delta = local - global``; FedAvg of the deltas;
(b) ``FederatedTrainer`` with the default client executor (Lightning's epoch loop);
(b') ``FederatedTrainer(client_executor="lean")`` (``--executors`` picks the executors);
(c) a centralised Lightning ``Trainer.fit`` of the same module over the same samples, the same
    number of SGD steps of batch 10 (a batch sampler over the whole training set): the per-step
    cost of Lightning without any per-client work;
(d) with ``--hand-vmap eager,compiled``: the hand-written ``torch.func`` loop of issue 30
    (``harness.vmap_fedavg``), eager and under ``torch.compile``: the batched executor's yardstick.

An executor of ``--executors`` may carry options: ``batched-compiled`` (``compile_batched_steps=True``)
and a ``:K`` suffix for ``max_batched_clients=K`` (``batched:50``). Each row also reports its
runs' first round (wall s, compilation included) and, on CUDA, the peak of allocated GPU memory.

(a) and every (b) select the same clients and cut the same batches; their final weights are
compared (dropout draws from the global RNG, reseeded before every run). Every way reads
batches by indexing the training tensors, which live on the device with ``--data-on device``
(the default; a ``TensorDataset`` of device tensors, which the federated datamodule serves
without DataLoader workers) or on the CPU with ``--data-on cpu`` (each batch is copied to the
device, as Lightning's ``batch_to_device`` does). Reported: clients/s and samples/s over the
measured rounds (mean ± std over repeats), on the wall clock on CUDA (after
``torch.cuda.synchronize()``) and on the process CPU clock on CPU (``--clock`` to change).

Run from the repository root::

    PYTHONPATH=. python benchmarks/pfl_cifar10.py --device cuda                  # the headline run
    PYTHONPATH=. python benchmarks/pfl_cifar10.py --device cuda --data-on cpu    # batches copied per step
    PYTHONPATH=. python benchmarks/pfl_cifar10.py --per-round 10 --rounds 2 --warmup 1 --repeats 1 --clients 200  # CPU
    PYTHONPATH=. python benchmarks/pfl_cifar10.py --quick                        # smoke run, < 1 min on CPU
    PYTHONPATH=. python benchmarks/pfl_cifar10.py --device cuda --per-round 200 --executors batched,batched-compiled,batched:50 \
        --hand-vmap eager,compiled                                               # issue 30's GPU rows
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch
from harness import (  # benchmarks/ is on sys.path
    CLOCKS,
    QUIET_TRAINER,
    RoundTimer,
    max_abs_diff,
    now,
    on_device,
    plain_fedavg,
    select_clients,
    vmap_fedavg,
)
from reporting import emit, header, load, mean_std
from torch import Tensor
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, TensorDataset

from fl_lightning import FedAvg, FederatedTrainer
from fl_lightning.data import CIFAR10, FederatedDataModule
from fl_lightning.models import PflCNN

SAMPLES_PER_CLIENT = 50
BATCH_SIZE = 10
LOCAL_EPOCHS = 1
STEPS = LOCAL_EPOCHS * -(-SAMPLES_PER_CLIENT // BATCH_SIZE)  # 5 steps: one epoch, the last batch full
LR = 0.1
SEED = 0
GOAL_CLIENTS_PER_S = 300  # on one H100-class GPU (issue #3)


@dataclass
class Workload:
    device: torch.device
    num_clients: int
    clients_per_round: int
    inputs: Tensor  # [N, 3, 32, 32], on the device with --data-on device
    labels: Tensor
    client_idx: list[Tensor]
    init: dict[str, Tensor]
    source: str

    def datamodule(self) -> FederatedDataModule:
        # A TensorDataset, not InMemoryDataset, whose ``targets`` NumPy view needs CPU labels.
        dm = FederatedDataModule(
            TensorDataset(self.inputs, self.labels), num_clients=self.num_clients, batch_size=BATCH_SIZE, seed=SEED
        )
        dm.setup("fit")
        return dm

    def select(self, round_idx: int) -> list[int]:
        return select_clients(SEED, round_idx, self.num_clients, self.clients_per_round)

    def module(self) -> PflCNN:
        module = PflCNN(lr=LR)
        module.load_state_dict(self.init)
        return module.to(self.device)

    def trainer_kwargs(self) -> dict:
        return {**on_device(self.device), **QUIET_TRAINER}


def make_workload(args: argparse.Namespace) -> Workload:
    n = args.clients * SAMPLES_PER_CLIENT
    if args.data_root is not None:
        data = CIFAR10(root=args.data_root, train=True)  # FileNotFoundError when it is not there
        if n > len(data):
            raise ValueError(f"--clients {args.clients} x {SAMPLES_PER_CLIENT} exceeds CIFAR-10's {len(data)} images.")
        inputs, labels = data.tensors[0][:n], data.tensors[1][:n]
        source = f"CIFAR-10 train from {args.data_root}, first {n} images"
    else:
        g = torch.Generator().manual_seed(1234)
        inputs, labels = torch.randn(n, 3, 32, 32, generator=g), torch.randint(0, 10, (n,), generator=g)
        source = "synthetic N(0, 1) tensors of CIFAR-10 shape"
    device = torch.device(args.device)
    if args.data_on == "device":
        inputs, labels = inputs.to(device), labels.to(device)
    torch.manual_seed(SEED)
    init = {k: v.clone() for k, v in PflCNN().state_dict().items()}
    work = Workload(device, args.clients, args.per_round, inputs, labels, [], init, source)
    dm = work.datamodule()
    work.client_idx = [torch.as_tensor(dm.client_indices(c), dtype=torch.int64) for c in range(args.clients)]
    return work


def run_plain(work: Workload, rounds: int) -> tuple[np.ndarray, dict[str, Tensor]]:
    net = work.module().net
    torch.manual_seed(SEED)  # dropout's masks: the same draws as in the other runs
    times, weights = plain_fedavg(
        net, work.inputs, work.labels, work.client_idx, work.select,
        steps=STEPS, rounds=rounds, lr=LR, batch_size=BATCH_SIZE, seed=SEED,
    )  # fmt: skip
    return times, {"net." + k: v for k, v in weights.items()}


def run_hand_vmap(work: Workload, rounds: int, compile: bool) -> tuple[np.ndarray, dict[str, Tensor]]:
    net = work.module().net
    torch.manual_seed(SEED)
    times, weights = vmap_fedavg(
        net, work.inputs, work.labels, work.client_idx, work.select,
        steps=STEPS, rounds=rounds, lr=LR, batch_size=BATCH_SIZE, seed=SEED, compile=compile,
    )  # fmt: skip
    return times, {"net." + k: v for k, v in weights.items()}


def executor_arguments(token: str) -> dict[str, Any]:
    """``FederatedTrainer`` arguments of an ``--executors`` entry: ``NAME[-compiled][:K]``."""
    name, _, cap = token.partition(":")
    compiled = name.endswith("-compiled")
    return {
        "client_executor": name.removesuffix("-compiled"),
        **({"compile_batched_steps": True} if compiled else {}),
        **({"max_batched_clients": int(cap)} if cap else {}),
    }


def run_federated(work: Workload, rounds: int, executor: str) -> tuple[np.ndarray, dict[str, Tensor]]:
    module, dm, timer = work.module(), work.datamodule(), RoundTimer()
    torch.manual_seed(SEED)
    trainer = FederatedTrainer(
        algorithm=FedAvg(),  # sample-weighted like the plain loop; equal to pfl-research's WeightByUser here
        **executor_arguments(executor),
        local_epochs=LOCAL_EPOCHS,
        clients_per_round=work.clients_per_round,
        seed=SEED,
        max_epochs=rounds,
        callbacks=[timer],
        **work.trainer_kwargs(),
    )
    trainer.fit(module, datamodule=dm)
    assert len(timer.marks) == rounds + 1, f"expected {rounds} rounds, saw {len(timer.marks) - 1}"
    return np.diff(np.stack(timer.marks), axis=0), {k: v.detach().clone() for k, v in module.state_dict().items()}


class StepTimer(pl.Callback):
    """Clocks every ``every`` optimizer steps and at the end of training."""

    def __init__(self, every: int) -> None:
        self.every, self.marks = every, []

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch, batch_idx: int) -> None:
        if trainer.global_step % self.every == 0:
            self.marks.append(now())

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.marks.append(now())


def run_centralised(work: Workload, rounds: int) -> np.ndarray:
    """A plain Lightning fit of ``rounds x clients_per_round x STEPS`` steps; seconds per round's worth of steps."""
    dataset = TensorDataset(work.inputs, work.labels)
    sampler = BatchSampler(RandomSampler(dataset, generator=torch.Generator().manual_seed(SEED)), BATCH_SIZE, False)
    loader = DataLoader(dataset, sampler=sampler, batch_size=None)  # one tensor index per batch, no collation
    round_steps = work.clients_per_round * STEPS
    timer = StepTimer(round_steps)
    torch.manual_seed(SEED)
    trainer = pl.Trainer(max_steps=rounds * round_steps, callbacks=[timer], **work.trainer_kwargs())
    trainer.fit(work.module(), train_dataloaders=loader)
    assert trainer.global_step == rounds * round_steps and len(timer.marks) == rounds + 1
    return np.diff(np.stack(timer.marks), axis=0)


@dataclass
class Row:
    label: str
    rates: dict[str, list[float]] = field(default_factory=lambda: {c: [] for c in CLOCKS})  # clients/s per repeat
    first: list[float] = field(default_factory=list)  # each run's first round, wall s (compilation included)
    peaks: list[float] = field(default_factory=list)  # each run's peak allocated GPU memory, MiB (CUDA only)

    def add(self, rounds: np.ndarray, warmup: int, clients_per_round: int) -> None:
        self.first.append(float(rounds[0, CLOCKS.index("wall")]))
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            self.peaks.append(torch.cuda.max_memory_allocated() / 2**20)
            torch.cuda.reset_peak_memory_stats()  # the next run's peak
        measured = rounds[warmup:]
        for i, clock in enumerate(CLOCKS):
            self.rates[clock].append(len(measured) * clients_per_round / float(measured[:, i].sum()))


def bench(work: Workload, args: argparse.Namespace, log: Callable[[str], None]) -> tuple[list[Row], dict[str, float]]:
    """The rows of the table, and per executor the largest |difference| of its final weights from (a)'s over repeats."""
    total, cpr = args.warmup + args.rounds, args.per_round
    rows = {"plain": Row("(a) plain PyTorch loop (copy_ weights, fresh SGD, delta, FedAvg)")}
    for i, executor in enumerate(args.executors):
        rows[executor] = Row("(b" + "'" * i + f") FederatedTrainer, `client_executor={executor!r}`")
    rows["central"] = Row("(c) centralised Lightning `fit`, same samples and step count (no clients)")
    for way in args.hand_vmap:
        rows[f"hand-{way}"] = Row(f"(d) hand-written `torch.func` loop ({way})")
    diffs: dict[str, list[float]] = {executor: [] for executor in (*args.executors, *(f"hand-{way}" for way in args.hand_vmap))}
    for rep in range(args.repeats):  # the ways interleaved, so slow drift hits all alike
        log(f"repeat {rep + 1}/{args.repeats}: plain loop")
        times, w_plain = run_plain(work, total)
        rows["plain"].add(times, args.warmup, cpr)
        for executor in args.executors:
            log(f"repeat {rep + 1}/{args.repeats}: FederatedTrainer ({executor})")
            times, weights = run_federated(work, total, executor)
            rows[executor].add(times, args.warmup, cpr)
            diffs[executor].append(max_abs_diff(w_plain, weights))
        log(f"repeat {rep + 1}/{args.repeats}: centralised fit")
        rows["central"].add(run_centralised(work, total), args.warmup, cpr)
        for way in args.hand_vmap:
            log(f"repeat {rep + 1}/{args.repeats}: hand-written torch.func loop ({way})")
            times, weights = run_hand_vmap(work, total, compile=way == "compiled")
            rows[f"hand-{way}"].add(times, args.warmup, cpr)
            diffs[f"hand-{way}"].append(max_abs_diff(w_plain, weights))
    return list(rows.values()), {executor: max(values) for executor, values in diffs.items()}


def render(rows: list[Row], diffs: dict[str, float], work: Workload, args: argparse.Namespace, head: list[str]) -> str:
    clock, other = args.clock, CLOCKS[1 - CLOCKS.index(args.clock)]
    base = float(np.mean(rows[0].rates[clock]))
    out = [
        "## Throughput on pfl-research's CIFAR-10 set-up",
        "",
        *head,
        (
            f"- workload: {work.num_clients} clients x {SAMPLES_PER_CLIENT} images ({work.source}); "
            f"{work.clients_per_round} clients/round; {LOCAL_EPOCHS} local epoch = {STEPS} SGD steps of batch "
            f"{BATCH_SIZE} (lr {LR}); FedAvg; PflCNN (pfl-research `simple_cnn`, "
            f"{sum(v.numel() for v in work.init.values()):,} parameters); training data on "
            f"{'the device' if args.data_on == 'device' else 'the CPU, copied per batch'}"
        ),
        (
            f"- {args.warmup} warm-up + {args.rounds} measured rounds per run x {args.repeats} repeats; clients/s = "
            f"measured clients / measured time on the **{clock}** clock, mean ± std over repeats ({other} clock "
            "alongside); for (c), a round is the same number of steps"
        ),
        "",
        f"| way | clients/s | samples/s | ms / client | vs plain loop | clients/s ({other} clock) | first round, wall s "
        "| peak GPU MiB |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        rates = row.rates[clock]
        mean = float(np.mean(rates))
        peak = f"{max(row.peaks):.0f}" if row.peaks else "-"
        out.append(
            f"| {row.label} | {mean_std(rates, 1)} | {mean_std(rates, 0, SAMPLES_PER_CLIENT * LOCAL_EPOCHS)} | "
            f"{1e3 / mean:.2f} | {base / mean:.2f}x | {mean_std(row.rates[other], 1)} | {np.median(row.first):.2f} | {peak} |"
        )
    best = max(float(np.mean(row.rates[clock])) for row in rows[1 : 1 + len(args.executors)])
    out += [
        "",
        "- final global weights, FederatedTrainer vs (a), max |diff|: "
        + "; ".join(f"{executor} {diff:.3g}" + (" (bit-identical)" if diff == 0 else "") for executor, diff in diffs.items())
        + (
            " (the batched executor and the hand loop draw each client's dropout masks under `vmap`, not in the plain "
            "loop's order)"
            if any(diff > 0 for diff in diffs.values())
            else ""
        ),
        f"- goal >= {GOAL_CLIENTS_PER_S} clients/s on one H100-class GPU: best federated way {best:.0f} clients/s "
        + (f"({'met' if best >= GOAL_CLIENTS_PER_S else 'NOT met'})" if work.device.type == "cuda" else "(CPU run: n/a)"),
        "",
    ]
    return "\n".join(out)


def quiet() -> None:
    """Silence Lightning's start-up logging and the warnings every benchmark Trainer would repeat."""
    for name in ("lightning.pytorch", "lightning.fabric", "lightning"):
        logging.getLogger(name).setLevel(logging.ERROR)
    for message in (r".*does not have many workers.*", r".*GPU available but not used.*", r".*validation_step.*"):
        warnings.filterwarnings("ignore", message=message)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--data-on", choices=("device", "cpu"), default="device", help="where the training tensors live")
    parser.add_argument("--data-root", help="directory holding torchvision's CIFAR-10 (else synthetic tensors)")
    parser.add_argument("--clients", type=int, help="number of clients (default 1000; quick 100)")
    parser.add_argument("--per-round", type=int, help="clients per round (default 50; quick 5)")
    parser.add_argument("--rounds", type=int, help="measured rounds per run (default 10; quick 2)")
    parser.add_argument("--warmup", type=int, help="warm-up rounds per run (default 2; quick 1)")
    parser.add_argument("--repeats", type=int, help="repeats of every run (default 3; quick 1)")
    parser.add_argument(
        "--executors", default="lightning,lean", help="FederatedTrainer client executors to run (rows (b), (b'), ...)"
    )
    parser.add_argument(
        "--hand-vmap", default="", help="rows (d): the hand-written torch.func loop, comma-separated of eager, compiled"
    )
    parser.add_argument("--quick", action="store_true", help="smoke run: 100 clients, 5 per round, 1 + 2 rounds, 1 repeat")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads(N); 0 keeps torch's default")
    parser.add_argument("--clock", choices=CLOCKS, help="clock of the table (default: wall on CUDA, cpu on CPU)")
    parser.add_argument("--out", help="also write the Markdown report to this file")
    args = parser.parse_args(argv)
    defaults = {"clients": (1000, 100), "per_round": (50, 5), "rounds": (10, 2), "warmup": (2, 1), "repeats": (3, 1)}
    for name, (full, quick) in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    args.executors = [e.strip() for e in args.executors.split(",") if e.strip()]
    args.hand_vmap = [w.strip() for w in args.hand_vmap.split(",") if w.strip()]
    if unknown := set(args.hand_vmap) - {"eager", "compiled"}:
        parser.error(f"--hand-vmap: unknown {sorted(unknown)}; choose from eager, compiled")
    if args.clock is None:
        args.clock = "wall" if args.device == "cuda" else "cpu"
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: CUDA is not available")
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    quiet()

    started, load_before = time.perf_counter(), load()
    work = make_workload(args)
    rows, diffs = bench(work, args, lambda msg: print(msg, file=sys.stderr, flush=True))
    head = header(started, load_before, threads=torch.get_num_threads(), cuda=work.device.type == "cuda")
    emit(render(rows, diffs, work, args, head), args.out)


if __name__ == "__main__":
    main()
