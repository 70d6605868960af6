"""Test accuracy on digits for each attack x defence (issue 19 item 2), over seeds.

The quickstart workload (scikit-learn's 8x8 digits, 20 clients, Dirichlet(0.5) label skew, MLP
64-128-10, lr 0.1, batch 10), shortened: ``--rounds`` rounds of ``--clients-per-round`` clients,
one local epoch each. A fraction ``--fraction`` of the federation is malicious
(:class:`~fl_lightning.robust.Byzantine`, drawn from the seed) and runs one attack:

* ``none``; ``label_flip`` (:class:`LabelFlip`, y -> 9 - y); ``sign_flip`` (:class:`SignFlip`, -Δ);
  ``scaled`` (:class:`ScaledUpdate`, 10 Δ); ``gaussian`` (:class:`GaussianUpdate`, N(0, 1) per weight).

against one defence: ``fedavg`` (none), ``median`` (:class:`CoordinateMedian`), ``trimmed_mean``
(:class:`TrimmedMean`, β = 0.2), ``krum`` (:class:`Krum`, f = 2), ``multi_krum`` (f = 2, m = 5),
``bulyan`` (:class:`Bulyan`, f = 2: n = 12 >= 4f + 3), ``norm_clip`` (FedAvg with the trainer's
``update_bound=NormClip(max_norm=1.0)``). The reported number is ``test_acc`` of the final global
model on the digits test split (``trainer.test`` after the fit), mean ± sample std over seeds.

The malicious clients among each round's sampled ones vary (4 of 20 malicious, 12 sampled: 0 to 4 per
round), so the report also gives that count per round and in how many rounds it exceeded f = 2, where
Krum, Multi-Krum and Bulyan ran outside their assumption (Bulyan cannot cover 4 at n = 12: 4f + 3 = 19).

Run from the repository root::

    PYTHONPATH=. python benchmarks/robustness.py                 # ~10 min on 2 CPU cores
    PYTHONPATH=. python benchmarks/robustness.py --quick         # one seed, 3 rounds: smoke run
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from dataclasses import dataclass

from harness import QUIET_TRAINER
from reporting import emit, header, load, mean_std  # benchmarks/ is on sys.path when run as a script
from workers import add_worker_arguments, run_in_workers

ATTACKS = ("none", "label_flip", "sign_flip", "scaled", "gaussian")
DEFENCES = ("fedavg", "median", "trimmed_mean", "krum", "multi_krum", "bulyan", "norm_clip")


@dataclass(frozen=True)
class RunSpec:
    attack: str
    defence: str
    seed: int
    rounds: int
    clients_per_round: int
    fraction: float


#: The f of the Byzantine-tolerant defences (krum, multi_krum, bulyan).
NUM_BYZANTINE = 2


@dataclass(frozen=True)
class RunResult:
    spec: RunSpec
    test_acc: float
    seconds: float
    #: Malicious clients among each round's sampled clients (empty without an attack).
    attackers: tuple[int, ...] = ()


def run_one(spec: RunSpec) -> RunResult:
    """Trains one (attack, defence, seed) through ``FederatedTrainer`` and tests the final model."""
    import lightning.pytorch as pl

    from fl_lightning import FedAvg, FederatedTrainer, NormClip
    from fl_lightning.data import Digits, Dirichlet, FederatedDataModule
    from fl_lightning.models import MLP
    from fl_lightning.robust import (
        Bulyan,
        Byzantine,
        CoordinateMedian,
        GaussianUpdate,
        Krum,
        LabelFlip,
        ScaledUpdate,
        SignFlip,
        TrimmedMean,
    )  # fmt: skip

    defence = {
        "fedavg": FedAvg,
        "median": CoordinateMedian,
        "trimmed_mean": lambda: TrimmedMean(beta=0.2),
        "krum": lambda: Krum(num_byzantine=NUM_BYZANTINE),
        "multi_krum": lambda: Krum(num_byzantine=NUM_BYZANTINE, num_selected=5),
        "bulyan": lambda: Bulyan(num_byzantine=NUM_BYZANTINE),
        "norm_clip": FedAvg,
    }[spec.defence]()
    attack = {
        "none": None,
        "label_flip": lambda: LabelFlip(num_classes=10),
        "sign_flip": SignFlip,
        "scaled": lambda: ScaledUpdate(scale=10.0),
        "gaussian": lambda: GaussianUpdate(std=1.0),
    }[spec.attack]
    algorithm = defence if attack is None else Byzantine(attack=attack(), fraction=spec.fraction, algorithm=defence)
    pl.seed_everything(spec.seed, verbose=False)
    data = FederatedDataModule(
        Digits(split="train"),
        Digits(split="test"),
        val_fraction=0.1,
        partitioner=Dirichlet(alpha=0.5),
        num_clients=20,
        batch_size=10,
        seed=spec.seed,
    )
    trainer = FederatedTrainer(
        algorithm=algorithm,
        clients_per_round=spec.clients_per_round,
        local_epochs=1,
        max_epochs=spec.rounds,
        seed=spec.seed,
        update_bound=NormClip(max_norm=1.0) if spec.defence == "norm_clip" else None,
        accelerator="cpu",
        devices=1,
        **QUIET_TRAINER,
    )
    started = time.perf_counter()
    model = MLP(in_features=64, hidden=(128,), num_classes=10, lr=0.1)
    trainer.fit(model, datamodule=data)
    (metrics,) = trainer.test(model, datamodule=data, verbose=False)
    malicious = algorithm.malicious if isinstance(algorithm, Byzantine) else frozenset()
    attackers = tuple(len(malicious.intersection(clients)) for clients in trainer.fit_loop.history) if malicious else ()
    return RunResult(spec, float(metrics["test_acc"]), time.perf_counter() - started, attackers)


def report(results: Sequence[RunResult], args: argparse.Namespace, head: list[str]) -> str:
    """The Markdown section: test accuracy, one row per attack and one column per defence."""
    acc = {(r.spec.attack, r.spec.defence): [] for r in results}
    for r in results:
        acc[(r.spec.attack, r.spec.defence)].append(r.test_acc)
    lines = [
        "## Robust aggregation under attack on digits (issue 19, item 2)",
        "",
        *head,
        "",
        f"Digits, 20 clients (Dirichlet 0.5), {args.clients_per_round} clients per round, {args.rounds} rounds of one "
        f"local epoch, MLP 64-128-10; {args.fraction:.0%} of the clients malicious (seeded). Cell: final test accuracy, "
        f"mean ± std over seeds {args.seeds}; accuracy, not time, is the result.",
        "",
        "| attack \\ defence | " + " | ".join(args.defences) + " |",
        "|---|" + "---:|" * len(args.defences),
    ]
    for attack in args.attacks:
        lines.append(f"| {attack} | " + " | ".join(mean_std(acc[(attack, d)]) for d in args.defences) + " |")
    # The sample, hence the count, depends on the seed only: one run per seed says it for every cell.
    per_seed = {r.spec.seed: r.attackers for r in results if r.attackers}
    counts = [n for attackers in per_seed.values() for n in attackers]
    if counts:
        over = sum(n > NUM_BYZANTINE for n in counts)
        histogram = ", ".join(f"{k}: {counts.count(k)}" for k in range(max(counts) + 1))
        lines += [
            "",
            f"Malicious clients per round (rounds x seeds = {len(counts)}; count: rounds): {histogram}. In {over} of "
            f"{len(counts)} rounds more than f = {NUM_BYZANTINE} took part: there Krum, Multi-Krum and Bulyan ran "
            "outside their assumption.",
        ]
    return "\n".join(lines) + "\n"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--clients-per-round", type=int, default=12)
    parser.add_argument("--fraction", type=float, default=0.2)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--attacks", nargs="+", choices=ATTACKS, default=list(ATTACKS))
    parser.add_argument("--defences", nargs="+", choices=DEFENCES, default=list(DEFENCES))
    parser.add_argument("--quick", action="store_true", help="one seed, 3 rounds")
    add_worker_arguments(parser)
    args = parser.parse_args(argv)
    if args.quick:
        args.seeds, args.rounds = [0], 3
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    specs = [
        RunSpec(a, d, s, args.rounds, args.clients_per_round, args.fraction)
        for a in args.attacks
        for d in args.defences
        for s in args.seeds
    ]
    started, load_before = time.perf_counter(), load()
    results = run_in_workers(
        run_one,
        specs,
        args,
        lambda r: f"{r.spec.attack:>10} {r.spec.defence:>12} seed {r.spec.seed}: {r.test_acc:.3f} ({r.seconds:.1f} s)",
    )
    print()
    emit(report(results, args, header(started, load_before, workers=args.jobs, threads=args.threads)), args.out)


if __name__ == "__main__":
    main()
