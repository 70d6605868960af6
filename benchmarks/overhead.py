"""Per-client overhead of fl_lightning's federated loop next to a plain PyTorch loop and a Trainer per client.

The same client workload (FedAvg, ``clients_per_round`` clients of ~50 samples, ``local_steps``
SGD steps of batch 10, no momentum) runs three ways, side by side in one process:

(a) a plain PyTorch loop: per client ``param.copy_`` of the global weights, a fresh
    ``torch.optim.SGD``, the steps, ``delta = local - global``; FedAvg of the deltas;
(b) ``FederatedTrainer``: all rounds inside one Lightning ``fit`` (the library's default path),
    also with ``client_executor="lean"`` (b') and ``client_executor="batched"`` (b'', the clients
    of a round trained together with ``torch.func.vmap``; equal to (a) up to float rounding);
(c) a new ``lightning.pytorch.Trainer`` + ``fit(max_steps=local_steps)`` per client over a
    ``DataLoader`` of the client's samples (how Flower-style simulations drive Lightning).

(a) and (b) select the same clients and cut the same batches (same seeds, same rules as the
library), so their final weights are compared: they should be identical bit for bit.

Reported: milliseconds per client = median over the measured rounds (all repeats pooled) of
``round time / clients per round``, aggregation included, on the process CPU clock (default)
or the wall clock (``--clock wall``); the other clock is always shown alongside. Everything runs
single-threaded in one process, so on an idle machine the two agree; CPU time is the default
because it is not inflated when other processes share the machine (the header records the load
average before and after). Also reported: ratios to (a), and the fixed per-client cost, from a
least-squares line through ms/client at several ``local_steps`` values extrapolated to 0 steps.

Run from the repository root::

    PYTHONPATH=. python benchmarks/overhead.py              # default, ~2-3 min on 2 CPU cores
    PYTHONPATH=. python benchmarks/overhead.py --quick      # ~20 s smoke run
    PYTHONPATH=. python benchmarks/overhead.py --out results.md --clock wall --models digits
    PYTHONPATH=. python benchmarks/overhead.py --profile    # cProfile of path (b), top functions
    PYTHONPATH=. python benchmarks/overhead.py --ragged 10,50  # ragged Dirichlet(0.5) clients, every executor
    PYTHONPATH=. python benchmarks/overhead.py --ragged 10,50 --ragged-executors batched,compiled  # + torch.compile
    PYTHONPATH=. python benchmarks/overhead.py --ragged 10,50 --device cuda  # the same on a GPU (wall clock)

``--device cuda`` puts the data, the plain loop's model and every Trainer on the GPU; the clock
defaults to the wall clock there (after ``torch.cuda.synchronize()``), as a GPU's work is not CPU time.

``--threads N`` calls ``torch.set_num_threads(N)`` (default 1; ``0`` keeps torch's default).
One thread is the default because on small 2-vCPU VMs torch's default of one intra-op
thread per core made even the plain loop 10-50x slower and erratic for these tiny models.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import logging
import pstats
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch
import torch._dynamo
from harness import (  # benchmarks/ is on sys.path as a script
    CLOCKS,
    QUIET_TRAINER,
    RoundTimer,
    max_abs_diff,
    now,
    on_device,
    plain_fedavg,
    select_clients,
)
from reporting import emit, header, load
from torch import Tensor, nn
from torch._dynamo.utils import counters
from torch.utils.data import DataLoader, TensorDataset

from fl_lightning import FederatedTrainer
from fl_lightning.data import Dirichlet, FederatedDataModule, InMemoryDataset, Partitioner
from fl_lightning.models import MLP
from fl_lightning.utils.seeding import derive_seed

LR = 0.05
BATCH_SIZE = 10
SEED = 0  # FederatedTrainer(seed=...), also used by the baselines to pick the same clients/batches
# --------------------------------------------------------------------------------------------
# Workload
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelSpec:
    name: str
    input_shape: tuple[int, ...]
    hidden: tuple[int, ...]
    num_classes: int = 10

    @property
    def in_features(self) -> int:
        return int(np.prod(self.input_shape))


MODELS = {
    "digits": ModelSpec("MLP 64-64-10 (digits-sized input, 64 features)", (64,), (64,)),
    "mnist": ModelSpec("MLP 784-200-200-10 (MNIST-shaped synthetic input, 1x28x28)", (1, 28, 28), (200, 200)),
}


def make_module(cls: type[MLP], spec: ModelSpec, init: dict[str, Tensor]) -> MLP:
    module = cls(in_features=spec.in_features, hidden=spec.hidden, num_classes=spec.num_classes, lr=LR)
    module.load_state_dict(init)
    return module


@dataclass
class Workload:
    spec: ModelSpec
    num_clients: int
    clients_per_round: int
    dataset: InMemoryDataset
    client_idx: list[Tensor]  # each client's dataset indices (int64)
    init: dict[str, Tensor]  # initial weights, shared by every method
    partitioner: Partitioner | None = None  # None: IID
    device: torch.device = torch.device("cpu")  # where the samples, the models and the Trainers live

    def datamodule(self) -> FederatedDataModule:
        dm = FederatedDataModule(
            self.dataset, partitioner=self.partitioner, num_clients=self.num_clients, batch_size=BATCH_SIZE, seed=SEED
        )
        dm.setup("fit")
        return dm

    def select(self, round_idx: int) -> list[int]:
        """The clients of a round, by the same rule as ``Algorithm.select_clients``."""
        return select_clients(SEED, round_idx, self.num_clients, self.clients_per_round)


def make_workload(
    spec: ModelSpec,
    num_clients: int,
    samples_per_client: int,
    clients_per_round: int,
    partitioner: Partitioner | None = None,
    device: torch.device = torch.device("cpu"),
) -> Workload:
    g = torch.Generator().manual_seed(1234)
    n = num_clients * samples_per_client
    dataset = InMemoryDataset(
        inputs=torch.randn(n, *spec.input_shape, generator=g).to(device),
        labels=torch.randint(0, spec.num_classes, (n,), generator=g).to(device),
        num_classes=spec.num_classes,
    )
    torch.manual_seed(0)
    init = MLP(in_features=spec.in_features, hidden=spec.hidden, num_classes=spec.num_classes).state_dict()
    init = {k: v.clone() for k, v in init.items()}
    work = Workload(spec, num_clients, clients_per_round, dataset, [], init, partitioner, device)
    dm = work.datamodule()
    work.client_idx = [torch.tensor(dm.client_indices(c), dtype=torch.int64) for c in range(num_clients)]
    return work


# --------------------------------------------------------------------------------------------
# (a) plain PyTorch loop
# --------------------------------------------------------------------------------------------


def run_plain(work: Workload, steps: int | None, total_rounds: int) -> tuple[np.ndarray, dict[str, Tensor]]:
    """Returns the (wall, CPU) seconds of every round and the final global weights."""
    spec = work.spec
    layers: list[nn.Module] = [nn.Flatten()]
    for w_in, w_out in zip((spec.in_features, *spec.hidden), spec.hidden):
        layers += [nn.Linear(w_in, w_out), nn.ReLU()]
    layers.append(nn.Linear(spec.hidden[-1], spec.num_classes))
    net = nn.Sequential(*layers)
    net.load_state_dict({k.removeprefix("net."): v for k, v in work.init.items()})
    net.to(work.device)
    x_all, y_all = work.dataset.tensors
    times, weights = plain_fedavg(
        net, x_all, y_all, work.client_idx, work.select,
        steps=steps, rounds=total_rounds, lr=LR, batch_size=BATCH_SIZE, seed=SEED,
    )
    return times, {"net." + k: v for k, v in weights.items()}


# --------------------------------------------------------------------------------------------
# (b) FederatedTrainer
# --------------------------------------------------------------------------------------------


def federated_trainer(
    work: Workload, steps: int | None, total_rounds: int, callbacks: list[pl.Callback], executor: str = "lightning", **kwargs: Any
) -> FederatedTrainer:
    """``steps=None``: one local epoch per client."""
    return FederatedTrainer(
        client_executor=executor,
        local_steps=steps,
        local_epochs=1 if steps is None else None,
        clients_per_round=work.clients_per_round,
        seed=SEED,
        max_epochs=total_rounds,
        callbacks=callbacks,
        **on_device(work.device),
        **QUIET_TRAINER,
        **kwargs,
    )


def run_federated(
    work: Workload, steps: int | None, total_rounds: int, module_cls: type[MLP], executor: str = "lightning", **kwargs: Any
) -> tuple[np.ndarray, dict[str, Tensor], float]:
    """Returns the (wall, CPU) seconds of every round, the final weights and the fit's start-up wall time (s)."""
    module = make_module(module_cls, work.spec, work.init)
    dm = work.datamodule()
    timer = RoundTimer()
    t0 = now()
    trainer = federated_trainer(work, steps, total_rounds, [timer], executor, **kwargs)
    trainer.fit(module, datamodule=dm)
    marks = timer.marks
    assert len(marks) == total_rounds + 1, f"expected {total_rounds} rounds, saw {len(marks) - 1}"
    weights = {k: v.detach().clone() for k, v in module.state_dict().items()}
    return np.diff(np.stack(marks), axis=0), weights, float(marks[0][0] - t0[0])


# --------------------------------------------------------------------------------------------
# (c) a new Trainer + fit per client
# --------------------------------------------------------------------------------------------


def run_trainer_per_client(work: Workload, steps: int, total_rounds: int) -> np.ndarray:
    """Returns the (wall, CPU) seconds of every round."""
    module = make_module(MLP, work.spec, work.init)
    live = dict(module.state_dict(keep_vars=True))
    global_state = {k: v.detach().clone() for k, v in live.items()}
    x_all, y_all = work.dataset.tensors
    times = []
    for r in range(total_rounds):
        t0 = now()
        acc = {k: torch.zeros_like(v) for k, v in global_state.items()}
        total = 0.0
        for cid in work.select(r):
            with torch.no_grad():
                for k, p in live.items():
                    p.copy_(global_state[k])
            idx = work.client_idx[cid]
            loader = DataLoader(
                TensorDataset(x_all[idx], y_all[idx]),
                batch_size=BATCH_SIZE,
                shuffle=True,
                generator=torch.Generator().manual_seed(derive_seed(SEED, "client", r, cid)),
            )
            trainer = pl.Trainer(max_steps=steps, **on_device(work.device), **QUIET_TRAINER)
            trainer.fit(module, train_dataloaders=loader)
            assert trainer.global_step == steps
            with torch.no_grad():
                for k, p in live.items():
                    acc[k].add_(p - global_state[k], alpha=float(len(idx)))
            total += len(idx)
        with torch.no_grad():
            for k, v in global_state.items():
                v.add_(acc[k].div_(total))
        times.append(now() - t0)
    return np.stack(times)


# --------------------------------------------------------------------------------------------
# Measurement plumbing
# --------------------------------------------------------------------------------------------


@dataclass
class Series:
    """Per-client times (ms) of the measured rounds, pooled over repeats, on both clocks."""

    values: dict[str, list[float]] = field(default_factory=lambda: {c: [] for c in CLOCKS})

    def add(self, rounds: np.ndarray, warmup: int, clients_per_round: int) -> None:
        for i, clock in enumerate(CLOCKS):
            self.values[clock] += [1e3 * float(s) / clients_per_round for s in rounds[warmup:, i]]

    def __bool__(self) -> bool:
        return bool(self.values["wall"])

    def median(self, clock: str) -> float:
        return statistics.median(self.values[clock])

    def quartiles(self, clock: str) -> tuple[float, float]:
        q = np.percentile(self.values[clock], [25, 75])
        return float(q[0]), float(q[1])


def fit_line(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Least-squares ``y = intercept + slope * x`` (NaNs with fewer than two step counts)."""
    if len(set(xs)) < 2:
        return float("nan"), float("nan")
    slope, intercept = np.polyfit(np.asarray(xs, dtype=float), np.asarray(ys, dtype=float), 1)
    return float(intercept), float(slope)


@dataclass
class Config:
    steps: int
    warmup: int
    rounds: int
    repeats: int
    tpc_warmup: int
    tpc_rounds: int
    fixed_steps: tuple[int, ...]
    num_clients: int
    samples_per_client: int
    clients_per_round: int
    device: torch.device = torch.device("cpu")


def bench_model(spec: ModelSpec, cfg: Config, log: Callable[[str], None]) -> dict[str, Any]:
    work = make_workload(spec, cfg.num_clients, cfg.samples_per_client, cfg.clients_per_round, device=cfg.device)
    total = cfg.warmup + cfg.rounds
    cpr = cfg.clients_per_round
    step_values = sorted(set(cfg.fixed_steps) | {cfg.steps})
    plain = {s: Series() for s in step_values}
    fed = {s: Series() for s in step_values}
    tpc = {s: Series() for s in step_values}
    fed_logging = Series()
    fed_batched = Series()
    startup: list[float] = []
    exact: list[float] = []
    batched_diff: list[float] = []

    for rep in range(cfg.repeats):
        log(f"  [{spec.name.split(' (')[0]}] repeat {rep + 1}/{cfg.repeats}")
        for s in step_values:  # (a) and (b) interleaved, so slow drift hits both alike
            times, w_plain = run_plain(work, s, total)
            plain[s].add(times, cfg.warmup, cpr)
            times, w_fed, start = run_federated(work, s, total, MLP)
            fed[s].add(times, cfg.warmup, cpr)
            exact.append(max_abs_diff(w_plain, w_fed))
            if s == cfg.steps:
                startup.append(start)
                times, w_log, _ = run_federated(work, s, total, MLP, executor="lean")
                fed_logging.add(times, cfg.warmup, cpr)
                exact.append(max_abs_diff(w_plain, w_log))
                times, w_batched, _ = run_federated(work, s, total, MLP, executor="batched")
                fed_batched.add(times, cfg.warmup, cpr)
                batched_diff.append(max_abs_diff(w_plain, w_batched))
            if s in (min(step_values), cfg.steps):  # (c) at two step counts only: it is slow
                tpc[s].add(run_trainer_per_client(work, s, cfg.tpc_warmup + cfg.tpc_rounds), cfg.tpc_warmup, cpr)

    return {
        "spec": spec,
        "steps": cfg.steps,
        "plain": plain,
        "fed": fed,
        "tpc": {k: v for k, v in tpc.items() if v},
        "fed_logging": fed_logging,
        "fed_batched": fed_batched,
        "max_diff": max(exact),
        "batched_diff": max(batched_diff),
        "startup_ms": 1e3 * statistics.median(startup),
    }


#: The ragged workload: digits-sized (1,800 samples of 64 features, 10 classes) over 50 clients by
#: Dirichlet(0.5) label skew, one local epoch of batch 10 per client, so clients differ in samples and steps.
RAGGED_CLIENTS, RAGGED_SAMPLES_PER_CLIENT, RAGGED_ALPHA = 50, 36, 0.5
#: ``key: (label, client_executor, extra FederatedTrainer arguments)`` of the ragged rows, after the plain loop.
RAGGED_EXECUTORS = {
    "auto": ("default (`client_executor=\"auto\"`)", "auto", {}),
    "lean": ("`client_executor=\"lean\"`", "lean", {}),
    "batched": ("`client_executor=\"batched\"`", "batched", {}),
    "batched10": ("`client_executor=\"batched\"`, `max_batched_clients=10`", "batched", {"max_batched_clients": 10}),
    "compiled": ("`client_executor=\"batched\"`, `compile_batched_steps=True`", "batched", {"compile_batched_steps": True}),
}


def bench_ragged(cfg: Config, clients_per_round: int, rows: Sequence[str], log: Callable[[str], None]) -> dict[str, Any]:
    """Per-round times of the plain loop and the ``rows`` executors on the ragged workload, interleaved per repeat;
    also each run's first round (wall s: compilation included) and the graphs ``torch.compile`` made during it."""
    work = make_workload(
        MODELS["digits"], RAGGED_CLIENTS, RAGGED_SAMPLES_PER_CLIENT, clients_per_round, Dirichlet(alpha=RAGGED_ALPHA), cfg.device
    )
    total = cfg.warmup + cfg.rounds
    executors = [RAGGED_EXECUTORS[key] for key in rows]
    series = {label: Series() for label in ("plain", *(label for label, _, _ in executors))}
    diffs: dict[str, list[float]] = {label: [] for label, _, _ in executors}
    first: dict[str, list[float]] = {label: [] for label, _, _ in executors}
    graphs: dict[str, list[int]] = {label: [] for label, _, _ in executors}
    for rep in range(cfg.repeats):
        log(f"  [ragged, {clients_per_round} clients/round] repeat {rep + 1}/{cfg.repeats}")
        times, w_plain = run_plain(work, None, total)
        series["plain"].add(times, cfg.warmup, clients_per_round)
        for label, executor, kwargs in executors:
            torch._dynamo.reset()  # each run compiles from scratch (and never reaches dynamo's recompile limit)
            counters.clear()
            times, weights, _ = run_federated(work, None, total, MLP, executor=executor, **kwargs)
            series[label].add(times, cfg.warmup, clients_per_round)
            diffs[label].append(max_abs_diff(w_plain, weights))
            first[label].append(float(times[0, CLOCKS.index("wall")]))
            graphs[label].append(int(counters["stats"]["unique_graphs"]))
    sizes = [len(idx) for idx in work.client_idx]
    return {
        "clients_per_round": clients_per_round, "series": series, "diffs": diffs, "first": first, "graphs": graphs,
        "sizes": (min(sizes), max(sizes)),
    }


# --------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------


def fmt(x: float) -> str:
    return f"{x:.2f}" if x < 100 else f"{x:.0f}"


def render(results: list[dict[str, Any]], cfg: Config, clock: str, head: list[str]) -> str:
    other = CLOCKS[1 - CLOCKS.index(clock)]
    out = [
        "## Per-client overhead: plain loop vs FederatedTrainer vs a Trainer per client",
        "",
        *head,
        f"- workload: {cfg.num_clients} clients x {cfg.samples_per_client} samples (IID), {cfg.clients_per_round} "
        f"clients/round, {cfg.steps} SGD steps of batch {BATCH_SIZE} per client (lr {LR}, no momentum), FedAvg",
        f"- (a)/(b): {cfg.warmup} warm-up + {cfg.rounds} measured rounds per run x {cfg.repeats} repeats; "
        f"(c): {cfg.tpc_warmup} warm-up + {cfg.tpc_rounds} measured rounds x {cfg.repeats} repeats",
        f"- ms / client = median over measured rounds (repeats pooled) of round time / clients per round, on the "
        f"**{clock}** clock (`--clock`; the {other} clock is shown alongside); aggregation included, "
        "Trainer construction and fit start-up of (b) excluded (listed separately)",
        "",
    ]
    for res in results:
        steps = res["steps"]
        plain, fed, tpc = res["plain"], res["fed"], res["tpc"]
        p, f, c, f_log = plain[steps], fed[steps], tpc[steps], res["fed_logging"]
        base, base_other = p.median(clock), p.median(other)
        rows = [
            ("(a) plain PyTorch loop (copy_ weights, fresh SGD, delta, FedAvg)", p),
            ("(b) FederatedTrainer, one fit, `fl_lightning.models.MLP`", f),
            ("(b') same with `client_executor=\"lean\"` (training_step + optimizer directly)", f_log),
            ("(b'') same with `client_executor=\"batched\"` (`torch.func.vmap` over same-shaped clients)", res["fed_batched"]),
            ("(c) new `Trainer` + `fit(max_steps)` per client, DataLoader over the client's data", c),
        ]
        out += [
            f"### {res['spec'].name}",
            "",
            f"| way of running a client | ms / client | p25-p75 | vs plain loop | {other} ms / client | vs plain ({other}) |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for label, series in rows:
            lo, hi = series.quartiles(clock)
            m, mo = series.median(clock), series.median(other)
            out.append(f"| {label} | {fmt(m)} | {fmt(lo)}-{fmt(hi)} | {m / base:.2f}x | {fmt(mo)} | {mo / base_other:.2f}x |")

        xs = sorted(plain)
        lines = {
            "(a) plain loop": (plain, xs),
            "(b) FederatedTrainer": (fed, xs),
            "(c) Trainer per client": (tpc, sorted(tpc)),
        }
        fits = {name: fit_line(ks, [ser[k].median(clock) for k in ks]) for name, (ser, ks) in lines.items()}
        out += [
            "",
            f"Fixed per-client cost ({clock} clock): least-squares line through ms / client at each local step count, "
            "extrapolated to 0 steps ((c) is run at two step counts only):",
            "",
            "| | " + " | ".join(f"{k} step{'s' if k > 1 else ''}" for k in xs) + " | 0 steps (intercept) | per step (slope) |",
            "|---|" + "---:|" * (len(xs) + 2),
        ]
        (i0, s0), (i1, s1) = fits["(a) plain loop"], fits["(b) FederatedTrainer"]
        for name, (ser, _) in lines.items():
            cells = [fmt(ser[k].median(clock)) if k in ser else "-" for k in xs]
            out.append(f"| {name} | " + " | ".join(cells) + f" | {fits[name][0]:.2f} | {fits[name][1]:.3f} |")
            if name.startswith("(b)"):
                diffs = [fmt(fed[k].median(clock) - plain[k].median(clock)) for k in xs]
                out.append("| (b) - (a) | " + " | ".join(diffs) + f" | {i1 - i0:.2f} | {s1 - s0:.3f} |")

        ratio, speedup = f.median(clock) / base, c.median(clock) / f.median(clock)
        out += [
            "",
            f"- contract: (b) <= 1.5x plain: **{ratio:.2f}x** ({'met' if ratio <= 1.5 else 'NOT met'}); "
            f"(b) >= 10x faster than (c): **{speedup:.1f}x** ({'met' if speedup >= 10 else 'NOT met'}; "
            f"the plain loop itself is {c.median(clock) / base:.1f}x faster than (c)); "
            f"fixed cost <= 0.5 ms: **{i1:.2f} ms** ("
            + ("met" if 0 <= i1 <= 0.5 else "NOT met" if i1 > 0.5 else "negative: too noisy to judge, rerun")
            + ")",
            f"- (b) fit start-up (FederatedTrainer() + fit() until round 0 starts): {res['startup_ms']:.0f} ms wall, once per run",
            f"- final global weights, (b)/(b') vs (a), every run: max |diff| = {res['max_diff']:.3g}"
            + (" (bit-identical)" if res["max_diff"] == 0 else ""),
            f"- final global weights, (b'') vs (a), every run: max |diff| = {res['batched_diff']:.3g}"
            + (" (bit-identical)" if res["batched_diff"] == 0 else " (float rounding of the batched products)"),
            "",
        ]
    return "\n".join(out)


def render_ragged(results: list[dict[str, Any]], cfg: Config, clock: str, head: list[str]) -> str:
    other = CLOCKS[1 - CLOCKS.index(clock)]
    lo, hi = results[0]["sizes"]
    out = [
        "## Ragged clients: plain loop vs each client executor, side by side in one run",
        "",
        *head,
        f"- workload: {MODELS['digits'].name}; {RAGGED_CLIENTS * RAGGED_SAMPLES_PER_CLIENT} samples over {RAGGED_CLIENTS} "
        f"clients by Dirichlet({RAGGED_ALPHA}) ({lo}-{hi} samples per client), one local epoch of batch {BATCH_SIZE} "
        f"(lr {LR}, no momentum), FedAvg",
        f"- {cfg.warmup} warm-up + {cfg.rounds} measured rounds per run x {cfg.repeats} repeats, the rows of a repeat run "
        f"one after another; ms / client = median over measured rounds of round time / clients per round, **{clock}** clock",
        "",
        f"| clients / round | way of running the clients | ms / client | p25-p75 | vs plain loop | {other} ms / client | "
        f"vs plain ({other}) | max abs diff of final weights vs plain | first round, wall s (median) | graphs compiled |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for res in results:
        series, base = res["series"], res["series"]["plain"]
        for label, ser in series.items():
            q1, q3 = ser.quartiles(clock)
            m, mo = ser.median(clock), ser.median(other)
            plain = label == "plain"
            diff = "-" if plain else f"{max(res['diffs'][label]):.2g}"
            first = "-" if plain else f"{statistics.median(res['first'][label]):.2f}"
            graphs = "-" if plain else "/".join(map(str, res["graphs"][label]))
            name = "plain PyTorch loop" if plain else label
            out.append(
                f"| {res['clients_per_round']} | {name} | {fmt(m)} | {fmt(q1)}-{fmt(q3)} | {m / base.median(clock):.2f}x | "
                f"{fmt(mo)} | {mo / base.median(other):.2f}x | {diff} | {first} | {graphs} |"
            )
    return "\n".join(out + [""])


def profile_federated(spec: ModelSpec, cfg: Config, top: int = 30) -> str:
    """cProfile of path (b) for ``cfg.warmup + cfg.rounds`` rounds; the top functions by own and cumulative time."""
    work = make_workload(spec, cfg.num_clients, cfg.samples_per_client, cfg.clients_per_round, device=cfg.device)
    run_federated(work, cfg.steps, 2, MLP)  # warm caches and lazy imports outside the profile
    profiler = cProfile.Profile()
    profiler.enable()
    run_federated(work, cfg.steps, cfg.warmup + cfg.rounds, MLP)
    profiler.disable()
    buf = io.StringIO()
    stats = pstats.Stats(profiler, stream=buf).strip_dirs()
    clients = (cfg.warmup + cfg.rounds) * cfg.clients_per_round
    buf.write(f"cProfile of (b), {spec.name}: {clients} clients x {cfg.steps} steps\n")
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(top)
    return buf.getvalue()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="~20 s smoke run (few rounds, one repeat)")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads(N); 0 keeps torch's default")
    parser.add_argument("--out", help="also write the Markdown report to this file")
    parser.add_argument(
        "--clock", choices=CLOCKS,
        help="clock of the tables: cpu (the default on CPU; process CPU time, robust to other processes on the machine) "
        "or wall (the default with --device cuda)",
    )
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where the data, models and Trainers live")
    parser.add_argument("--models", default="digits,mnist", help=f"comma-separated subset of {sorted(MODELS)}")
    parser.add_argument("--steps", type=int, default=10, help="local SGD steps per client")
    parser.add_argument(
        "--clients-per-round", type=int, default=10, help="clients per round (of 100); the batched executor trains them together"
    )
    parser.add_argument("--warmup", type=int, help="warm-up rounds per run (default 5; quick 2)")
    parser.add_argument("--rounds", type=int, help="measured rounds per run (default 20; quick 5)")
    parser.add_argument("--repeats", type=int, help="repeats of every run (default 3; quick 1)")
    parser.add_argument("--profile", action="store_true", help="print a cProfile of path (b) instead of benchmarking")
    parser.add_argument(
        "--ragged", default="", metavar="CLIENTS_PER_ROUND",
        help="instead: the ragged Dirichlet(0.5) digits workload at these comma-separated clients per round (e.g. 10,50)",
    )
    parser.add_argument(
        "--ragged-executors", default="auto,lean,batched,batched10", metavar="ROWS",
        help=f"the ragged rows after the plain loop, comma-separated, of {sorted(RAGGED_EXECUTORS)}",
    )
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: CUDA is not available")
    args.clock = args.clock or ("wall" if args.device == "cuda" else "cpu")

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    # Lightning prints a few lines per Trainer; (c) builds hundreds of them.
    for name in ("lightning.pytorch", "lightning.fabric", "lightning"):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", message=r".*does not have many workers.*")
    warnings.filterwarnings("ignore", message=r".*GPU available but not used.*")

    quick = args.quick
    cfg = Config(
        steps=args.steps,
        warmup=args.warmup if args.warmup is not None else (2 if quick else 5),
        rounds=args.rounds if args.rounds is not None else (5 if quick else 20),
        repeats=args.repeats if args.repeats is not None else (1 if quick else 3),
        tpc_warmup=1 if quick else 2,
        tpc_rounds=2 if quick else 10,
        fixed_steps=(1, 10) if quick else (1, 2, 5, 10),
        num_clients=100,
        samples_per_client=50,
        clients_per_round=args.clients_per_round,
        device=torch.device(args.device),
    )
    specs = [MODELS[m.strip()] for m in args.models.split(",") if m.strip()]

    if args.profile:
        for spec in specs:
            print(profile_federated(spec, cfg))
        return

    started, load_before = time.perf_counter(), load()

    def report_header() -> list[str]:
        return header(started, load_before, threads=torch.get_num_threads(), cuda=args.device == "cuda")

    if args.ragged:
        rows = [key.strip() for key in args.ragged_executors.split(",")]
        if unknown := [key for key in rows if key not in RAGGED_EXECUTORS]:
            parser.error(f"--ragged-executors: unknown {unknown}; choose from {sorted(RAGGED_EXECUTORS)}")
        ragged = [
            bench_ragged(cfg, int(c), rows, lambda msg: print(msg, file=sys.stderr, flush=True)) for c in args.ragged.split(",")
        ]
        emit(render_ragged(ragged, cfg, args.clock, report_header()), args.out)
        return
    results = []
    for spec in specs:
        print(f"benchmarking {spec.name} ...", file=sys.stderr, flush=True)
        results.append(bench_model(spec, cfg, lambda msg: print(msg, file=sys.stderr, flush=True)))
    emit(render(results, cfg, args.clock, report_header()), args.out)


if __name__ == "__main__":
    main()
