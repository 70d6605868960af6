"""Issue 39's done criterion: SCAFFOLD with a full client store and a checkpoint every round, budgeted against not.

SCAFFOLD (Karimireddy et al. 2020, Algorithm 1) keeps one control variate :math:`c_i` per client, as large as the
model. Here ``--clients`` clients (default 5,000) train an ``MLP(in_features=1000, hidden=(), num_classes=100)``
(100,100 parameters: a 0.4 MB :math:`c_i`, 1.9 GiB for 5,000 clients), ``--per-round`` of them a round (default
10 %), one local step on 4 samples each, through :class:`~fl_lightning.FederatedTrainer` with its default
``RoundCheckpoint`` (a checkpoint every round). Every client's :math:`c_i` is written (zeros, which SCAFFOLD assumes
for a client without one: the numbers do not change) when the fit starts, so the rounds run at the store's full
size, the audit's "late rounds", instead of after the ~30 rounds that would fill it.

Each configuration runs in a fresh subprocess, one after the other on the same machine: ``client_state_memory``
``--budget`` (default 100MB) and ``None`` (unbudgeted: every :math:`c_i` in memory). Measured:

- the floor: the resident memory before the fit (data, model, torch) plus the budget, what the run needs if the
  store holds to its budget and nothing else grows; the peak RSS (``ru_maxrss``, which counts the pages of the
  memory-mapped spill file a checkpoint reads: page cache the kernel reclaims under pressure) against the RSS
  floor, and the peak anonymous RSS (``RssAnon``, sampled every 5 ms: memory the process holds, without the
  shared libraries' pages) against the anonymous floor (target ≤ 1.2×);
- seconds per round (training, aggregation and the round's checkpoint), budgeted against unbudgeted (target ≤ 1.3×);
- the bytes each round's checkpoint writes (its round file and the client shard beside it: incremental checkpoints,
  ``fl_lightning/checkpointing/client_shards.py``), against the model and the entries the round changed.

Run from the repository root (writes ~2 GB of spill file and two 2 GB checkpoints per configuration, deleted
afterwards)::

    PYTHONPATH=. python benchmarks/scaffold_budget.py --folder /work/benchtmp --out /tmp/scaffold_budget.md
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

import lightning.pytorch as pl
import torch
from client_store_memory import rss_parts  # benchmarks/ is on sys.path when run as a script
from reporting import emit, header, load

MIB = 2**20
FEATURES, CLASSES, SAMPLES = 1000, 100, 4


def resident() -> tuple[int, int]:
    """Resident bytes of this process, all (anonymous and file-backed) and anonymous."""
    anon, file = rss_parts()
    return anon + file, anon


class PeakAnon(threading.Thread):
    """Samples ``RssAnon`` every 5 ms until stopped; ``peak`` is the largest seen."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.peak, self.running = 0, True

    def run(self) -> None:
        while self.running:
            self.peak = max(self.peak, resident()[1])
            time.sleep(0.005)


class Rounds(pl.Callback):
    """Fills every client's :math:`c_i` when the fit starts (the store is bound to its budget by then) and records
    when each round starts, and the bytes of the files each round's checkpoint writes."""

    def __init__(self, clients: int) -> None:
        self.clients, self.starts, self.checkpoint_bytes, self.fill_s = clients, [], [], 0.0
        self.seen: set[str] = set()

    def _written(self, trainer: pl.Trainer) -> None:
        """Appends the bytes of the files (not links) that appeared in the checkpoint folder since the last call."""
        folder = os.path.join(trainer.default_root_dir, "checkpoints")
        new = [e for e in os.scandir(folder) if e.is_file(follow_symlinks=False) and e.name not in self.seen]
        self.seen.update(e.name for e in new)
        self.checkpoint_bytes.append(sum(e.stat().st_size for e in new))

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        started = time.perf_counter()
        algorithm = trainer.algorithm  # type: ignore[attr-defined]
        zeros = {name: torch.zeros_like(c) for name, c in algorithm.control.items()}
        for cid in range(self.clients):
            algorithm.client_controls.put(cid, zeros)
        self.fill_s = time.perf_counter() - started

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.starts.append(time.perf_counter())
        if trainer.current_epoch > 0:
            self._written(trainer)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.starts.append(time.perf_counter())
        self._written(trainer)


def federation(clients: int) -> Any:
    """``clients`` clients of :data:`SAMPLES` random samples each (one local batch), seeded."""
    from fl_lightning.data import FederatedDataModule, InMemoryDataset

    g = torch.Generator().manual_seed(0)
    n = clients * SAMPLES
    dataset = InMemoryDataset(
        inputs=torch.randn(n, FEATURES, generator=g), labels=torch.randint(0, CLASSES, (n,), generator=g), num_classes=CLASSES
    )
    return FederatedDataModule(dataset, num_clients=clients, batch_size=SAMPLES, holdout_fraction=0.0, seed=0)


def child(args: argparse.Namespace) -> dict[str, Any]:
    """One configuration, in this fresh process."""
    from fl_lightning import SCAFFOLD, FederatedTrainer
    from fl_lightning.models import MLP

    torch.set_num_threads(1)
    data = federation(args.clients)
    torch.manual_seed(0)
    model = MLP(in_features=FEATURES, hidden=(), num_classes=CLASSES, lr=0.05)
    root = tempfile.mkdtemp(prefix="scaffold_budget-", dir=args.folder)
    rounds = Rounds(args.clients)
    trainer = FederatedTrainer(
        algorithm=SCAFFOLD(),
        clients_per_round=args.per_round,
        local_steps=1,
        max_epochs=args.rounds,
        client_state_memory=None if args.budget == "none" else args.budget,
        default_root_dir=root,
        callbacks=[rounds],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
    )
    data.setup("fit")
    setup_rss, setup_anon = resident()
    sampler = PeakAnon()
    sampler.start()
    try:
        trainer.fit(model, datamodule=data)
    finally:
        sampler.running = False
        sampler.join()
        shutil.rmtree(root, ignore_errors=True)
    store = trainer.algorithm.client_controls
    seconds = [b - a for a, b in zip(rounds.starts, rounds.starts[1:])]
    return {
        "budget": args.budget,
        "budget_bytes": store._budget or 0,
        "setup_rss": setup_rss,
        "setup_anon": setup_anon,
        "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "peak_anon": sampler.peak,
        "state_bytes": store.nbytes(),
        "entry_bytes": store.nbytes() // max(len(store), 1),
        "fill_s": rounds.fill_s,
        "round_s": seconds,
        "checkpoint_bytes": rounds.checkpoint_bytes,
        "model_bytes": sum(t.numel() * t.element_size() for t in model.state_dict().values()),
    }


def run_child(args: argparse.Namespace, budget: str) -> dict[str, Any]:
    cmd = [
        sys.executable, __file__, "--child", "--budget", budget, "--clients", str(args.clients),
        "--per-round", str(args.per_round), "--rounds", str(args.rounds), *(["--folder", args.folder] if args.folder else []),
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        raise RuntimeError(f"budget {budget} failed:\n{done.stderr[-3000:]}")
    return json.loads(lines[-1])


def report(rows: dict[str, dict[str, Any]], args: argparse.Namespace, started: float, load_before: str) -> str:
    budgeted, free = rows[args.budget], rows["none"]
    lines = [
        "## SCAFFOLD, a full client store, a checkpoint every round: budgeted against unbudgeted (issue 39, done criterion)",
        "",
        *header(started, load_before, threads=1),
        f"- {args.clients:,} clients × {budgeted['entry_bytes'] / 4:,.0f} float32 parameters "
        f"({budgeted['state_bytes'] / MIB:,.0f} MiB of c_i, filled when the fit starts in {budgeted['fill_s']:.1f} s "
        f"budgeted, {free['fill_s']:.1f} s not), {args.per_round} clients a round, {args.rounds} rounds, "
        "each followed by its round checkpoint",
        "",
        "| budget | floor: RSS (MiB) | peak RSS (MiB) | ×floor | floor: anonymous (MiB) | peak anonymous (MiB) | ×floor "
        "| s / round (each) | mean s / round |",
        "|---|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for r in (free, budgeted):
        floor, anon_floor = r["setup_rss"] + r["budget_bytes"], r["setup_anon"] + r["budget_bytes"]
        each = ", ".join(f"{s:.1f}" for s in r["round_s"])
        lines.append(
            f"| {r['budget']} | {floor / MIB:,.0f} | {r['peak_rss'] / MIB:,.0f} | {r['peak_rss'] / floor:.2f} "
            f"| {anon_floor / MIB:,.0f} | {r['peak_anon'] / MIB:,.0f} | {r['peak_anon'] / anon_floor:.2f} | {each} "
            f"| {sum(r['round_s']) / len(r['round_s']):.1f} |"
        )
    later = slice(1, None) if len(budgeted["round_s"]) > 1 else slice(None)
    ratio = sum(budgeted["round_s"][later]) / sum(free["round_s"][later])
    changed = budgeted["model_bytes"] + args.per_round * budgeted["entry_bytes"]
    each = ", ".join(f"{b / MIB:,.0f}" for b in budgeted["checkpoint_bytes"])
    lines += [
        "",
        f"- seconds per round after the first, budgeted / unbudgeted: **{ratio:.2f}×** (target ≤ 1.3×)",
        f"- bytes each round's checkpoint writes (round file and client shard), budgeted: {each} MiB; the model and "
        f"the {args.per_round} entries a round changes are {changed / MIB:,.0f} MiB, the whole store "
        f"{budgeted['state_bytes'] / MIB:,.0f} MiB (the first checkpoint writes every entry once)",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=5000)
    parser.add_argument("--per-round", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--budget", default="100MB", help="client_state_memory of the budgeted run")
    parser.add_argument("--folder", default=None, help="where the runs write their checkpoints and spill files")
    parser.add_argument("--out", default=None)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args)))
        return
    started, load_before = time.perf_counter(), load()
    rows = {}
    for budget in ("none", args.budget):
        rows[budget] = run_child(args, budget)
        print(rows[budget], file=sys.stderr, flush=True)
    emit(report(rows, args, started, load_before), args.out)


if __name__ == "__main__":
    main()
