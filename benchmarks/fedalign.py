"""FedALIGN vs. its baselines on offline data (Ravi & Shomorony, "Utilizing Free Clients in
Federated Learning for Focused Model Enhancement", Sec. 4, Fig. 1-2).

The paper's qualitative claim: on the priority objective, FedALIGN (priority clients plus the
non-priority clients whose loss on the broadcast model is within epsilon of the priority loss)
beats FedAvg on all clients clearly and is at least as good as FedAvg on the priority clients
only. Two offline federations, every run through the real
:class:`~fl_lightning.FederatedTrainer` with :class:`~fl_lightning.FedALIGN`,
:class:`~fl_lightning.PriorityOnly` or :class:`~fl_lightning.AllClients`:

* ``synth``: :class:`~fl_lightning.data.PrioritizedSynthetic`: 10 Synthetic(1, 1) priority
  devices with 20 training samples each (scarce priority data), 5 clean non-priority clients
  (100 samples of the priority mixture) and 10 noisy ones (100 samples of the mixture with OUR
  RECONSTRUCTION of the paper's label flips and irrelevant points, medium noise: both skews
  1.5, q_max = 0.8, r_max = 1). Logistic regression 60 -> 10. Test: 1000 clean samples of the
  priority mixture.
* ``digits``: scikit-learn's 8x8 digits, ``LabelsPerClient(2)`` over 20 clients: the labels
  are dealt in 5 pairs, each held by 4 clients. Priority clients 0 and 1 hold two pairs (4
  classes); non-priority clients 5, 6, 10, 11, 15, 16 hold the same pairs (aligned), the other
  12 hold the 6 other classes (misaligned). MLP 64-32-10. Test: the digits test split,
  per-class accuracy/loss weighted by the priority clients' class proportions.

``--paper`` switches both to the paper's own federations (Sec. 4, App. B) and adds App. C.1's
baseline, at the paper's 200 rounds, seeds 0-2 (about 18 CPU-minutes):

* ``--synth paper``: the 10 priority devices and 10 noisy non-priority clients only (no clean
  free clients), every size from the FedProx generator, ``int(lognormal(4, 2)) + 50``.
* ``--digits shards``: 60 clients with McMahan et al.'s single-class shards (``Shards(2)``, 120
  shards of the digits training split), priority clients 0 and 1; which non-priority clients
  share the priority classes is left to chance, as in the paper.
* ``--holdout 0.2`` and ``LocalOnly``: every non-priority client's own model against the
  federated model on that client's held-out samples (App. C.1, Fig. 3).

Shared settings (the paper's where it states them): lr 0.1, E = 5 local epochs, epsilon = 0.2
(0.4 for ``--noise high``, as in the paper), the first 10% of rounds priority-only for every
method (the paper's warm-up; it does not say whether its "All" baseline warms up too), full
participation, batch 20 (not stated in the paper), plain SGD. Per seed, the data (synth: the
whole federation; digits: the label dealing), the model initialisation and the clients' batch
order change; within a seed the three methods start from the same weights on the same data.

Reported per (dataset, method): mean ± sample std over seeds of ``round/priority_test_acc``
and ``round/priority_test_loss`` after the last round and averaged over the last ``--tail``
rounds, and the non-priority clients admitted per round after the warm-up, split into aligned
(synth: the clean clients; digits: clients whose labels all belong to the priority classes) and
the others, and the rounds to a target accuracy (``--target``, ``--target-acc``). Then paired differences
FedALIGN - AllClients and FedALIGN - PriorityOnly.

Run from the repository root::

    PYTHONPATH=. python benchmarks/fedalign.py               # default, ~7 min on 2 idle CPU cores
    PYTHONPATH=. python benchmarks/fedalign.py --quick       # ~1 min smoke run
    PYTHONPATH=. python benchmarks/fedalign.py --rounds 200 --seeds 0 1 2 3 4 --noise high
    PYTHONPATH=. python benchmarks/fedalign.py --out table.md --jobs 1
    PYTHONPATH=. python benchmarks/fedalign.py --paper       # the paper's federations, > 15 min
    PYTHONPATH=. python benchmarks/fedalign.py --synth paper --noise low --save-runs low.json
    PYTHONPATH=. python benchmarks/fedalign.py --synth paper --noise high --load-runs low.json  # reuses PriorityOnly

Runs are spread over ``--jobs`` worker processes (default: the number of CPU cores), each with
one torch thread.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import lightning.pytorch as pl
from harness import QUIET_TRAINER
from reporting import emit, header, load, mean_std, significance  # benchmarks/ is on sys.path when run as a script
from workers import add_worker_arguments, run_in_workers

METHODS = ("FedALIGN", "PriorityOnly", "AllClients", "LocalOnly")
DATASETS = ("synth", "digits")
#: ``--paper``: the paper's own federations (Sec. 4, App. B), its 200 rounds (inferred from "the
#: first 20 warm-up rounds" = 10 %), App. C.1's local-model baseline on 20 % held-out samples.
PAPER = {"synth": "paper", "digits": "shards", "methods": list(METHODS), "seeds": [0, 1, 2], "rounds": 200, "holdout": 0.2}
# (label-flip skew, irrelevant-points skew, epsilon) of the paper's three synthetic noise levels.
#: ``--digits-model``: hidden widths of the digits model (64 inputs, 10 classes): this benchmark's
#: MLP, the paper's logistic regression and McMahan et al.'s 2NN.
DIGITS_MODELS = {"mlp": (32,), "logreg": (), "2nn": (200, 200)}
NOISE = {"low": (0.5, 0.5, 0.2), "medium": (1.5, 1.5, 0.2), "high": (5.0, 5.0, 0.4)}
#: The settings a synth PriorityOnly run never reads: the free clients' noise (PrioritizedSynthetic draws
#: the priority devices' and the test samples independently of it) and FedALIGN's epsilon, so
#: ``--load-runs`` may reuse such a run across noise settings.
FREE_CLIENT_SETTINGS = frozenset({"noise", "epsilon_synth", "label_noise", "noise_start"})
#: The methods whose mean tail accuracy sets the rounds-to-target threshold: the paper's speed claim is against
#: priority-only training, and AllClients' lower tail would set a threshold reached within the warm-up, where
#: every method trains the same priority-only model.
TARGET_METHODS = ("FedALIGN", "PriorityOnly")


@dataclass(frozen=True)
class Settings:
    """One benchmark configuration (shared by all its runs)."""

    rounds: int
    local_epochs: int
    batch_size: int
    lr: float
    warmup_fraction: float
    tail: int
    noise: str
    epsilon_synth: float
    epsilon_digits: float
    synth_priority_samples: int | None  # None: the FedProx generator's int(lognormal(4, 2)) + 50
    synth_nonpriority_samples: int | None
    synth_clean: int
    synth_noisy: int
    digits_clients: int
    digits_split: str  # "labels" (LabelsPerClient(2)) or "shards" (McMahan's Shards(2))
    holdout: float  # per-client held-out fraction: App. C.1's local test data
    label_noise: float = 0.8  # q_max of our noise reconstruction (the paper's "label noise factor" is 2.5)
    noise_start: str = "one"  # noise levels from j = 1 ("one") or j = 0 ("zero": one clean noisy client)
    digits_model: str = "mlp"  # see DIGITS_MODELS


@dataclass(frozen=True)
class RunSpec:
    dataset: str
    method: str
    seed: int
    settings: Settings


@dataclass
class RunResult:
    spec: RunSpec
    final_acc: float
    final_loss: float
    tail_acc: float
    tail_loss: float
    aligned_per_round: float  # admitted aligned non-priority clients per round after the warm-up
    misaligned_per_round: float
    num_aligned: int  # aligned non-priority clients in the federation
    local_acc: float  # App. C.1: the non-priority clients' held-out accuracy (LocalOnly: their own models)
    wall_s: float
    cpu_s: float
    accs: list[float] = field(default_factory=list)


def build(spec: RunSpec) -> tuple[pl.LightningDataModule, pl.LightningModule, list[int] | None, float]:
    """The federation, the model (initialised from the seed), the priority ids and epsilon."""
    import torch

    from fl_lightning.data import Digits, FederatedDataModule, LabelsPerClient, Natural, PrioritizedSynthetic, Shards
    from fl_lightning.models import MLP, LogisticRegression

    s, seed = spec.settings, spec.seed
    if spec.dataset == "synth":
        flip_skew, random_skew, _ = NOISE[s.noise]
        kwargs = dict(
            num_priority=10,
            num_clean=s.synth_clean,
            num_noisy=s.synth_noisy,
            priority_samples=s.synth_priority_samples,
            nonpriority_samples=s.synth_nonpriority_samples,
            label_noise=s.label_noise,
            label_noise_skew=flip_skew,
            random_fraction=1.0,
            random_fraction_skew=random_skew,
            test_samples=1000,
            seed=seed,
            noise_start=s.noise_start,
        )
        train = PrioritizedSynthetic(**kwargs)  # type: ignore[arg-type]
        data = FederatedDataModule(
            train,
            PrioritizedSynthetic(split="test", **kwargs),  # type: ignore[arg-type]
            partitioner=Natural(),
            num_clients=len(set(train.client_ids.tolist())),
            batch_size=s.batch_size,
            holdout_fraction=s.holdout,
            seed=seed,
        )
        torch.manual_seed(seed)
        return data, LogisticRegression(in_features=60, num_classes=10, lr=s.lr), None, s.epsilon_synth
    data = FederatedDataModule(
        Digits(split="train"),
        Digits(split="test"),
        partitioner=LabelsPerClient(2) if s.digits_split == "labels" else Shards(2),
        num_clients=s.digits_clients,
        batch_size=s.batch_size,
        holdout_fraction=s.holdout,
        seed=seed,
    )
    torch.manual_seed(seed)
    return data, MLP(in_features=64, hidden=DIGITS_MODELS[s.digits_model], num_classes=10, lr=s.lr), [0, 1], s.epsilon_digits


def aligned_clients(spec: RunSpec, data: pl.LightningDataModule, priority: list[int]) -> set[int]:
    """Non-priority clients aligned with the objective: synth's clean clients; on digits, those
    holding only priority classes."""
    if spec.dataset == "synth":
        return set(data.train.clean_clients)  # type: ignore[attr-defined]
    priority_classes = sum(data.label_counts(c) for c in priority) > 0  # type: ignore[attr-defined]
    return {
        c
        for c in range(data.num_clients)  # type: ignore[attr-defined]
        if c not in priority and not (data.label_counts(c) > 0)[~priority_classes].any()  # type: ignore[attr-defined]
    }


def run_one(spec: RunSpec) -> RunResult:
    """Trains one (dataset, method, seed) configuration through ``FederatedTrainer``."""
    from fl_lightning import AllClients, FedALIGN, FederatedCallback, FederatedTrainer, LocalOnly, PriorityOnly

    s = spec.settings

    class Recorder(FederatedCallback):
        """The priority metrics of the global model after every round."""

        def __init__(self) -> None:
            self.rounds: list[dict[str, float]] = []

        def on_round_aggregated(self, trainer: pl.Trainer, pl_module: pl.LightningModule, round_idx: int, metrics: dict[str, float]) -> None:
            self.rounds.append(dict(metrics))

    data, model, priority, epsilon = build(spec)
    every = range(data.num_clients)  # type: ignore[attr-defined]
    nonpriority = [c for c in every if c not in (priority or data.train.priority_clients)]  # type: ignore[attr-defined]
    local = nonpriority if s.holdout > 0 else None  # App. C.1: scored on their own held-out samples
    if spec.method == "LocalOnly":
        algorithm = LocalOnly(clients=nonpriority)
    else:
        method = {"FedALIGN": FedALIGN, "PriorityOnly": PriorityOnly, "AllClients": AllClients}[spec.method]
        algorithm = method(priority=priority, epsilon=epsilon, warmup_fraction=s.warmup_fraction, evaluate_priority=True, evaluate_clients=local)
    recorder = Recorder()
    trainer = FederatedTrainer(
        algorithm=algorithm,
        local_epochs=s.local_epochs,
        max_epochs=s.rounds,
        seed=spec.seed,
        accelerator="cpu",
        devices=1,
        callbacks=[recorder],
        **QUIET_TRAINER,  # no validation: the algorithm's own priority evaluation is what we record
    )
    started, cpu_started = time.perf_counter(), time.process_time()
    trainer.fit(model, datamodule=data)
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu_started

    accs = [r.get("round/priority_test_acc", math.nan) for r in recorder.rounds]  # LocalOnly: no global model
    losses = [r.get("round/priority_test_loss", math.nan) for r in recorder.rounds]
    aligned = aligned_clients(spec, data, [c for c in every if c not in nonpriority])
    after_warmup = algorithm.accepted_history[algorithm.warmup_rounds :] if spec.method != "LocalOnly" else []
    return RunResult(
        spec=spec,
        final_acc=accs[-1],
        final_loss=losses[-1],
        tail_acc=statistics.fmean(accs[-s.tail :]),
        tail_loss=statistics.fmean(losses[-s.tail :]),
        aligned_per_round=statistics.fmean([len(set(a) & aligned) for a in after_warmup] or [0]),
        misaligned_per_round=statistics.fmean([len(set(a) - aligned) for a in after_warmup] or [0]),
        num_aligned=len(aligned),
        local_acc=recorder.rounds[-1].get("round/local_test_acc", math.nan),
        wall_s=wall,
        cpu_s=cpu,
        accs=accs,
    )


def save_runs(results: Sequence[RunResult], path: str) -> None:
    """Writes every run (its spec and settings, metrics and per-round priority accuracy) as JSON."""
    with open(path, "w") as f:
        json.dump([asdict(r) for r in results], f)


def settings_differences(run: Settings, current: Settings) -> set[str]:
    """The names of the settings in which a saved run differs from this invocation's."""
    return {f.name for f in dataclasses.fields(Settings) if getattr(run, f.name) != getattr(current, f.name)}


def load_runs(paths: Sequence[str], settings: Settings, wanted: set[tuple[str, str, int]]) -> list[RunResult]:
    """The ``wanted`` (dataset, method, seed) runs that ``--save-runs`` wrote to ``paths`` whose settings are this
    invocation's, except that a synth PriorityOnly run may differ in :data:`FREE_CLIENT_SETTINGS`; the others are
    skipped (and counted), so that one file can serve several invocations."""
    results: dict[tuple[str, str, int], RunResult] = {}
    for path in paths:
        with open(path) as f:
            records = json.load(f)
        skipped = 0
        for record in records:
            spec = RunSpec(**{**record["spec"], "settings": Settings(**record["spec"]["settings"])})
            key = (spec.dataset, spec.method, spec.seed)
            reusable = spec.dataset == "synth" and spec.method == "PriorityOnly"
            if key not in wanted or settings_differences(spec.settings, settings) - (FREE_CLIENT_SETTINGS if reusable else set()):
                skipped += 1
                continue
            if key in results:
                raise SystemExit(f"--load-runs: run {key} is in more than one file (again in {path}).")
            results[key] = RunResult(**{**record, "spec": spec})
        print(f"--load-runs {path}: {len(records) - skipped} run(s) loaded, {skipped} of other seeds, methods or settings skipped")
    return list(results.values())


# --------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------


def rounds_to(result: RunResult, target: float) -> int:
    """The first round (1-based) whose priority accuracy reaches ``target``; the run's rounds + 1
    when it never does (a censored count, so a run that never gets there ranks last)."""
    return next((i + 1 for i, acc in enumerate(result.accs) if acc >= target), len(result.accs) + 1)


def _tally(differences: Sequence[float]) -> str:
    """``better/tied/worse`` counts of paired differences where larger is better."""
    return f"{sum(x > 0 for x in differences)}/{sum(x == 0 for x in differences)}/{sum(x < 0 for x in differences)}"


def describe(settings: Settings, seeds: list[int]) -> str:
    s = settings
    flip_skew, random_skew, _ = NOISE[s.noise]
    fedprox_sizes = "int(lognormal(4, 2)) + 50 (FedProx's generator)"
    split = (
        "LabelsPerClient(2), priority clients [0, 1] (4 classes)"
        if s.digits_split == "labels"
        else "Shards(2) (McMahan's single-class shards, 2 per client), priority clients [0, 1] (at most 4 classes)"
    )
    holdout = f" {s.holdout:.0%} of every client's samples held out (App. C.1's local test data)." if s.holdout else ""
    return (
        f"Settings: {s.rounds} rounds, the first {s.warmup_fraction:.0%} priority-only for every method, full "
        f"participation, E = {s.local_epochs} local epochs of plain SGD, lr {s.lr:g}, batch {s.batch_size}; seeds {seeds}.{holdout} "
        f"**synth**: PrioritizedSynthetic, 10 Synthetic(1, 1) priority devices x {s.synth_priority_samples or fedprox_sizes} samples, "
        f"{s.synth_clean} clean + {s.synth_noisy} noisy non-priority clients x {s.synth_nonpriority_samples or fedprox_sizes} samples, "
        f"{s.noise} noise (our reconstruction: skews {flip_skew:g}/{random_skew:g}, q_max {s.label_noise:g}, r_max 1, levels from j = "
        f"{0 if s.noise_start == 'zero' else 1}), "
        f"logistic regression 60 -> 10, epsilon {s.epsilon_synth:g}, test = 1000 clean samples of the priority mixture. "
        f"**digits**: sklearn digits, {split} over {s.digits_clients} clients, {s.digits_model} "
        f"{'-'.join(map(str, (64, *DIGITS_MODELS[s.digits_model], 10)))}, epsilon {s.epsilon_digits:g}, "
        f"test = digits test split weighted by the priority class proportions. Final = after the last round; tail = mean "
        f"over the last {s.tail} rounds. LocalOnly: each non-priority client's own model (App. C.1), no priority model."
    )


def cell(values: Sequence[float]) -> str:
    """``mean ± std`` of the values, or a dash where the method has no such metric (NaN)."""
    return "–" if any(math.isnan(v) for v in values) else mean_std(values)


def report(results: list[RunResult], settings: Settings, args: argparse.Namespace, head: list[str]) -> str:
    by = {(r.spec.dataset, r.spec.method, r.spec.seed): r for r in results}
    datasets = [d for d in DATASETS if any(r.spec.dataset == d for r in results)]
    methods = [m for m in METHODS if any(r.spec.method == m for r in results)]
    seeds = sorted({r.spec.seed for r in results})
    pool = [m for m in methods if m in TARGET_METHODS] or [m for m in methods if m != "LocalOnly"]
    targets = {
        d: args.target_acc
        if args.target_acc is not None
        else args.target * min(statistics.fmean(r.tail_acc for r in results if r.spec.dataset == d and r.spec.method == m) for m in pool)
        for d in datasets
    }
    reused = sorted(
        f"{r.spec.dataset} {r.spec.method} seed {r.spec.seed} ("
        + ", ".join(f"{name} {getattr(r.spec.settings, name)}" for name in sorted(settings_differences(r.spec.settings, settings)))
        + ")"
        for r in results
        if settings_differences(r.spec.settings, settings)
    )
    lines = [
        *head,
        "",
        describe(settings, seeds),
        *(["", f"Reused from another noise setting, which they never read (--load-runs): {'; '.join(reused)}."] if reused else []),
        "",
        "Rounds to target: the first round whose priority accuracy reaches "
        + ("the given --target-acc" if args.target_acc is not None else f"{args.target:g} x the lowest mean tail accuracy of {' and '.join(pool)}")
        + f" on that dataset (targets: {', '.join(f'{d} {targets[d]:.3f}' for d in datasets)}); a run that never reaches "
        f"it counts as rounds + 1.",
        "",
        "| dataset | method | final priority acc | tail priority acc | final priority loss | tail priority loss | rounds to target (reached) | admitted per round: aligned / other |"
        + (" non-priority clients' held-out acc (App. C.1) |" if settings.holdout else ""),
        "|---|---|---|---|---|---|---|---|" + ("---|" if settings.holdout else ""),
    ]
    for d in datasets:
        for m in methods:
            runs = [by[(d, m, seed)] for seed in seeds if (d, m, seed) in by]
            reach = [rounds_to(r, targets[d]) for r in runs]
            lines.append(
                f"| {d} | {m} | {cell([r.final_acc for r in runs])} | {cell([r.tail_acc for r in runs])} "
                f"| {cell([r.final_loss for r in runs])} | {cell([r.tail_loss for r in runs])} "
                f"| {'–' if m == 'LocalOnly' else f'{mean_std(reach, digits=1)} ({sum(x <= settings.rounds for x in reach)}/{len(reach)})'} "
                f"| {statistics.fmean(r.aligned_per_round for r in runs):.1f} of {statistics.fmean(r.num_aligned for r in runs):.0f}"
                f" / {statistics.fmean(r.misaligned_per_round for r in runs):.1f} |"
                + (f" {cell([r.local_acc for r in runs])} |" if settings.holdout else "")
            )
    if "FedALIGN" in methods:
        lines += [
            "",
            "Paired differences (same seed: same data and initial weights), FedALIGN minus baseline, with the number of seeds "
            "where FedALIGN is better / tied / worse. One significance rule for every row: the 95 % t-interval of the mean "
            "paired difference over the seeds, significant (yes) when it excludes 0:",
            "",
            "| dataset | baseline | tail acc diff | 95 % CI, significant | better/tied/worse (acc) | tail loss diff | 95 % CI, significant "
            "| better/tied/worse (loss) | rounds-to-target diff | 95 % CI, significant | better/tied/worse (rounds) |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for d in datasets:
            for other in (m for m in methods if m not in ("FedALIGN", "LocalOnly")):
                pairs = [(by[(d, "FedALIGN", s)], by[(d, other, s)]) for s in seeds if (d, "FedALIGN", s) in by and (d, other, s) in by]
                if not pairs:
                    continue
                acc = [a.tail_acc - o.tail_acc for a, o in pairs]
                loss = [a.tail_loss - o.tail_loss for a, o in pairs]
                speed = [float(rounds_to(a, targets[d]) - rounds_to(o, targets[d])) for a, o in pairs]
                lines.append(
                    f"| {d} | {other} | {mean_std(acc)} | {significance(acc)} | {_tally(acc)} | {mean_std(loss)} | {significance(loss)} "
                    f"| {_tally([-x for x in loss])} | {mean_std(speed, digits=1)} | {significance(speed)} | {_tally([-x for x in speed])} |"
                )
    if {"FedALIGN", "LocalOnly"} <= set(methods):
        lines += ["", "App. C.1, the non-priority clients' held-out accuracy, FedALIGN's global model minus their own local models:", ""]
        for d in datasets:
            diffs = [by[(d, "FedALIGN", s)].local_acc - by[(d, "LocalOnly", s)].local_acc for s in seeds if (d, "FedALIGN", s) in by and (d, "LocalOnly", s) in by]
            lines.append(f"- {d}: {mean_std(diffs)}, FedALIGN better/tied/worse on {_tally(diffs)} seeds")
    cpu = sum(r.cpu_s for r in results)
    lines += [
        "",
        f"Per run: {statistics.fmean(r.wall_s for r in results):.1f} s wall, {statistics.fmean(r.cpu_s for r in results):.1f} s CPU "
        f"(mean); all runs: {cpu:.0f} CPU-seconds, i.e. about {cpu / args.jobs:.0f} s of wall time on {args.jobs} idle core(s).",
    ]
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="~1 minute smoke run (20 rounds, 2 seeds)")
    parser.add_argument("--paper", action="store_true", help="the paper's compositions (see PAPER; explicit flags win)")
    parser.add_argument("--datasets", nargs="+", default=list(DATASETS), choices=DATASETS)
    parser.add_argument("--methods", nargs="+", default=list(METHODS[:3]), choices=METHODS)
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    parser.add_argument("--rounds", type=int, default=100, help="the paper's is 200 (inferred)")
    parser.add_argument("--local-epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=20, help="not stated in the paper")
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--warmup-fraction", type=float, default=0.1)
    parser.add_argument("--noise", default="medium", choices=sorted(NOISE), help="synth noise level (skews; epsilon 0.4 for high)")
    parser.add_argument("--epsilon", type=float, help="override epsilon for both datasets")
    parser.add_argument("--tail", type=int, default=10, help="average the metrics over the last TAIL rounds")
    parser.add_argument("--synth", default="ours", choices=("ours", "paper"), help="synth federation (see the docstring)")
    parser.add_argument("--digits", default="labels", choices=("labels", "shards"), help="digits split (see the docstring)")
    parser.add_argument("--holdout", type=float, default=0.0, help="per-client held-out fraction (App. C.1; LocalOnly needs it)")
    parser.add_argument("--label-noise", type=float, default=0.8, help="synth: q_max, the noisiest client's flip fraction (the paper's factor: 2.5)")
    parser.add_argument("--noise-start", default="one", choices=("one", "zero"), help="synth: noise levels from j = 1 or j = 0 (a clean noisy client)")
    parser.add_argument("--digits-model", default="mlp", choices=sorted(DIGITS_MODELS), help="digits: MLP 64-32-10, logistic regression or 2NN")
    parser.add_argument("--digits-clients", type=int, help="digits clients (default 20 with --digits labels, 60 with shards)")
    parser.add_argument(
        "--target", type=float, default=0.95, help="rounds to target: TARGET x the lower mean tail accuracy of FedALIGN and PriorityOnly"
    )
    parser.add_argument("--target-acc", type=float, help="rounds to target: this priority accuracy instead (one threshold across invocations)")
    parser.add_argument("--save-runs", help="also write every run (settings, metrics, per-round accuracy) to this JSON file")
    parser.add_argument(
        "--load-runs",
        nargs="+",
        default=[],
        help="report these --save-runs files' runs instead of re-running them (same settings; a synth PriorityOnly run "
        "may come from another noise setting, which it never reads)",
    )
    add_worker_arguments(parser)
    if parser.parse_known_args(argv)[0].paper:
        parser.set_defaults(**PAPER)
    args = parser.parse_args(argv)
    if "LocalOnly" in args.methods and not args.holdout > 0:
        parser.error(f"LocalOnly is scored on the clients' held-out samples: it needs --holdout > 0, got {args.holdout}.")
    if args.quick:
        args.rounds, args.seeds, args.tail = 20, [0, 1], 5
    if args.target_acc is not None and not 0 < args.target_acc <= 1:
        parser.error(f"--target-acc is a priority accuracy in (0, 1], got {args.target_acc}.")
    if not 1 <= args.tail <= args.rounds:
        parser.error(f"--tail must be in [1, --rounds={args.rounds}], got {args.tail}.")
    return args


def progress_line(result: RunResult) -> str:
    """One line per finished run."""
    sp = result.spec
    return (
        f"{sp.dataset} {sp.method} seed={sp.seed}: priority acc final {result.final_acc:.4f} tail {result.tail_acc:.4f}, "
        f"loss final {result.final_loss:.4f} tail {result.tail_loss:.4f}, admitted aligned/other per round "
        f"{result.aligned_per_round:.1f}/{result.misaligned_per_round:.1f} ({result.wall_s:.1f} s wall, {result.cpu_s:.1f} s CPU)"
    )

def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    epsilon_synth = NOISE[args.noise][2] if args.epsilon is None else args.epsilon
    settings = Settings(
        rounds=args.rounds,
        local_epochs=args.local_epochs,
        batch_size=args.batch_size,
        lr=args.lr,
        warmup_fraction=args.warmup_fraction,
        tail=args.tail,
        noise=args.noise,
        epsilon_synth=epsilon_synth,
        epsilon_digits=0.2 if args.epsilon is None else args.epsilon,
        synth_priority_samples=20 if args.synth == "ours" else None,
        synth_nonpriority_samples=100 if args.synth == "ours" else None,
        synth_clean=5 if args.synth == "ours" else 0,
        synth_noisy=10,
        digits_clients=args.digits_clients or (20 if args.digits == "labels" else 60),
        digits_split=args.digits,
        holdout=args.holdout,
        label_noise=args.label_noise,
        noise_start=args.noise_start,
        digits_model=args.digits_model,
    )
    # The slowest runs (AllClients trains every client) first, so the pool finishes together.
    specs = [RunSpec(d, m, seed, settings) for d in args.datasets for m in args.methods for seed in args.seeds]
    wanted = {(spec.dataset, spec.method, spec.seed) for spec in specs}
    loaded = load_runs(args.load_runs, settings, wanted)
    done = {(r.spec.dataset, r.spec.method, r.spec.seed) for r in loaded}
    specs = [spec for spec in specs if (spec.dataset, spec.method, spec.seed) not in done]
    specs.sort(key=lambda spec: spec.method != "AllClients")  # stable
    print(asdict(settings), flush=True)
    started, load_before = time.perf_counter(), load()
    results = run_in_workers(run_one, specs, args, progress_line) if specs else []
    if args.save_runs:
        save_runs(results, args.save_runs)
    args.jobs = max(args.jobs, 1)  # 0 (no run left to do) would leave the report's wall-time estimate undefined
    results += loaded
    text = report(results, settings, args, header(started, load_before, workers=args.jobs, threads=args.threads))
    print()
    emit(text, args.out)


if __name__ == "__main__":
    main()
