"""Buffered asynchronous FL on a virtual clock: FedBuff vs FedStaleWeight (Ma et al., issue 8), and
FedAsync (Xie et al. 2019) as an unbuffered baseline (issue 18).

The paper's set-up (§6.2): 15 agents, 10 fast with job durations U(1, 2) holding labels 4-9 and
5 slow with U(8, 12) holding labels 0-3 (:class:`~fl_lightning.data.LabelGroups` +
:class:`~fl_lightning.participation.DelayGroups`), buffer b = 5, every agent always in flight,
Q = 1 local SGD step of batch 32. Every run goes through the real
:class:`~fl_lightning.FederatedTrainer` / :class:`~fl_lightning.loops.AsyncFitLoop`. Three
measurements:

(a) **Influence shares** over a long virtual run (``--aggregations``, default 3,000): each
    client's share of the total aggregation weight (``algorithm.influence``), summed per speed
    group, and the mean staleness per group, next to the notes' Appendix B simulation and Eq. 6.
    The event trace depends on the seed only, so FedBuff and FedStaleWeight of one seed see the
    same arrivals (checked); the ``alg1`` and ``aflbench`` weight variants are replayed on those
    traces by a plain NumPy reference, which also re-derives the two loop runs' influence.
(b) **Learning** on offline data with the paper's label/speed split (scikit-learn digits by
    default, or 10 Gaussian blobs in d = 20 as in the notes' §6.3 test 6), softmax regression,
    the same runs as (a): per-class accuracy of the global model on the test set at several
    numbers of aggregations. Traces are paired, so equal aggregations are equal virtual time.
(c) **Wall-clock per client update** of the asynchronous loop vs the synchronous loop doing the
    same client work: FedStaleWeight (b = 5, 15 clients) vs FedAvg with 5 clients per round,
    same model, data, batch and local step, ``--timing-aggregations`` aggregations / rounds,
    alternated ``--timing-repeats`` times in this process, after the pool of (a)/(b) has
    finished. Per-update time = process CPU time (and wall time) / client updates trained,
    over the whole ``fit`` and over its first and last tenth.

(d) **FedAsync** (``--fedasync constant polynomial hinge``): the same traces with FedAsync, which
    updates on every arrival (alpha = 0.6; polynomial a = 0.5, hinge a = 10, b = 4, the paper's
    values). It runs ``b`` times more model versions, so its version ``b * k`` has seen the same
    arrivals, at the same virtual time, as FedBuff's aggregation ``k``: influence shares and
    accuracies are reported at those points, beside FedBuff and FedStaleWeight.

Run from the repository root::

    PYTHONPATH=. python benchmarks/async_fairness.py            # default, 3 seeds (see RESULTS.md for its time)
    PYTHONPATH=. python benchmarks/async_fairness.py --quick    # ~1-2 min smoke run
    PYTHONPATH=. python benchmarks/async_fairness.py --data blobs --lr 0.05 --seeds 0 1 2 3 4
    PYTHONPATH=. python benchmarks/async_fairness.py --train-at arrival --timing-aggregations 0   # Fig. 2's parameter staleness
    # afl-bench's whole runtime behind Fig. 2: train at arrival, wait for a new version, its staleness window
    PYTHONPATH=. python benchmarks/async_fairness.py --train-at arrival --runtime aflbench --lr 0.01 --timing-aggregations 0
    PYTHONPATH=. python benchmarks/async_fairness.py --out table.md --jobs 1
    PYTHONPATH=. python benchmarks/async_fairness.py --fedasync constant polynomial hinge --aggregations 600 --timing-aggregations 0

Runs of (a)/(b) are spread over ``--jobs`` worker processes (default: the CPU cores), each with
one torch thread.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import lightning.pytorch as pl
import numpy as np
from harness import QUIET_TRAINER
from reporting import emit, header, load, mean_std  # benchmarks/ is on sys.path when run as a script
from workers import add_worker_arguments, init_worker, run_in_workers

from fl_lightning import FederatedCallback

ALGORITHMS = ("FedBuff", "FedStaleWeight")
FEDASYNC = {"constant": {}, "polynomial": {"a": 0.5}, "hinge": {"a": 10.0, "b": 4}}  # the paper's s(t - tau)
NUM_FAST, NUM_SLOW, BUFFER = 10, 5, 5
FAST_LABELS, SLOW_LABELS = (4, 5, 6, 7, 8, 9), (0, 1, 2, 3)
FAST_DELAY, SLOW_DELAY = (1.0, 2.0), (8.0, 12.0)
# Notes, Appendix B (numpy simulation, 3,000 aggregations, seed 0): slow-group share of weight.
# FedBuff(train_at=...): the papers' algorithm, or the runtime behind FedStaleWeight's Fig. 2 (afl-bench).
TRAIN_AT = {
    "dispatch": "clients train on the model they pulled at dispatch (snapshot semantics, the papers' algorithm)",
    "arrival": "clients train on the model current at their arrival (`train_at='arrival'`, parameter staleness 0, "
    "the runtime behind the paper's Fig. 2)",
}
#: ``--runtime``: the paper's algorithm (default: clients re-pull at once, a true sliding window of
#: staleness) or afl-bench's runtime behind Fig. 2 (a client whose model is still current waits for the
#: next aggregation; the published staleness window, which drops the newest value when full). The
#: whole afl-bench runtime adds ``--train-at arrival``.
RUNTIMES = {
    "paper": {"pull_policy": "immediate", "tracker": "window"},
    "aflbench": {"pull_policy": "wait_new_version", "tracker": "aflbench"},
}
NOTES_SHARE = {"FedBuff": 0.0695, "eq8": 0.1992, "alg1": 0.1807, "aflbench": 0.2050}


@dataclass(frozen=True)
class Settings:
    """One benchmark configuration (shared by all its runs)."""

    data: str
    aggregations: int
    eval_every: int
    lr: float
    batch_size: int
    local_steps: int
    window: int
    train_at: str  # FedBuff(train_at=...): "dispatch" (the papers' algorithm) or "arrival" (Fig. 2's runtime)
    runtime: str = "paper"  # RUNTIMES: pull policy and staleness window


@dataclass(frozen=True)
class RunSpec:
    algorithm: str
    seed: int
    settings: Settings


@dataclass
class RunResult:
    spec: RunSpec
    influence: list[float]
    arrivals: list[tuple[float, int, int]]
    accuracy: dict[int, list[float]]  # aggregations -> per-class accuracy of the global model
    overall: dict[int, float]  # aggregations -> accuracy on the whole test set
    virtual_time: dict[int, float]
    wall_s: float
    cpu_s: float
    class_counts: list[int] = field(default_factory=list)
    first_ms: float = 0.0  # CPU ms per client update over the first tenth of the aggregations
    last_ms: float = 0.0  # ... and over the last tenth


# --------------------------------------------------------------------------------------------
# The paper's set-up
# --------------------------------------------------------------------------------------------


def blobs(split: str, seed: int, *, dim: int = 20, separation: float = 1.0) -> Any:
    """10 Gaussian classes in ``dim`` dimensions (notes §6.3 test 6): 600 train / 200 test per class."""
    import torch

    from fl_lightning.data import InMemoryDataset

    means = np.random.default_rng([seed, 0]).normal(0.0, separation, (10, dim))
    per_class = 600 if split == "train" else 200
    rng = np.random.default_rng([seed, 1 if split == "train" else 2])
    labels = np.repeat(np.arange(10), per_class)
    inputs = means[labels] + rng.normal(size=(len(labels), dim))
    return InMemoryDataset(inputs=torch.tensor(inputs, dtype=torch.float32), labels=torch.as_tensor(labels), num_classes=10)


def paper_data(settings: Settings, seed: int) -> Any:
    """The paper's split: clients 0-9 hold labels 4-9, clients 10-14 labels 0-3, IID within a group."""
    from fl_lightning.data import Digits, FederatedDataModule, LabelGroups

    if settings.data == "digits":
        train, test = Digits(split="train"), Digits(split="test")
    else:
        train, test = blobs("train", seed), blobs("test", seed)
    return FederatedDataModule(
        train,
        test,
        partitioner=LabelGroups(sizes=[NUM_FAST, NUM_SLOW], labels=[list(FAST_LABELS), list(SLOW_LABELS)]),
        num_clients=NUM_FAST + NUM_SLOW,
        batch_size=settings.batch_size,
        seed=seed,
    )


def versions_per_aggregation(name: str) -> int:
    """Model versions per FedBuff aggregation: FedAsync updates on each of the ``b`` arrivals."""
    return BUFFER if name.startswith("FedAsync") else 1


def paper_algorithm(name: str, window: int, train_at: str = "dispatch", runtime: str = "paper") -> Any:
    from fl_lightning.algorithms import FedAsync, FedBuff, FedStaleWeight, StalenessTracker
    from fl_lightning.participation import DelayGroups, UniformDelay

    delays = DelayGroups(sizes=[NUM_FAST, NUM_SLOW], models=[UniformDelay(*FAST_DELAY), UniformDelay(*SLOW_DELAY)])
    pull, tracker_mode = RUNTIMES[runtime]["pull_policy"], RUNTIMES[runtime]["tracker"]
    if name == "FedBuff":
        return FedBuff(buffer_size=BUFFER, delays=delays, train_at=train_at, pull_policy=pull)
    if name.startswith("FedAsync-"):
        staleness = name.removeprefix("FedAsync-")
        return FedAsync(alpha=0.6, staleness=staleness, delays=delays, train_at=train_at, pull_policy=pull, **FEDASYNC[staleness])  # type: ignore[arg-type]
    tracker = StalenessTracker(tracker_mode, window=window)
    return FedStaleWeight(buffer_size=BUFFER, delays=delays, variant="eq8", tracker=tracker, train_at=train_at, pull_policy=pull)


def trainer_kwargs() -> dict[str, Any]:
    # No validation: the benchmark evaluates the global model itself (below).
    return {"accelerator": "cpu", "devices": 1, **QUIET_TRAINER}


class UpdateClock(FederatedCallback):
    """Counts client updates and marks (updates so far, CPU time) after each aggregation."""

    def __init__(self) -> None:
        self.updates = 0
        self.marks: list[tuple[int, float]] = []

    def on_client_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, client: Any, update: Any) -> None:
        self.updates += 1

    def on_round_aggregated(self, trainer: pl.Trainer, pl_module: pl.LightningModule, round_idx: int, metrics: dict[str, float]) -> None:
        self.marks.append((self.updates, time.process_time()))


def run_one(spec: RunSpec) -> RunResult:
    """One (algorithm, seed) run through ``FederatedTrainer``: influence, trace, per-class accuracy."""
    import torch

    from fl_lightning import FederatedTrainer
    from fl_lightning.models import LogisticRegression
    from fl_lightning.evaluation.probe import sample_metrics

    s = spec.settings
    scale = versions_per_aggregation(spec.algorithm)
    data = paper_data(s, spec.seed)
    data.setup("fit")
    x_test, y_test = data.test.tensors  # type: ignore[union-attr]
    counts = np.bincount(y_test.numpy(), minlength=10)

    class Recorder(UpdateClock):
        """Per-class accuracy of the global model every ``eval_every`` aggregations (one forward pass)."""

        def __init__(self) -> None:
            super().__init__()
            self.accuracy: dict[int, list[float]] = {}
            self.overall: dict[int, float] = {}
            self.virtual_time: dict[int, float] = {}

        def on_round_aggregated(self, trainer: pl.Trainer, pl_module: pl.LightningModule, round_idx: int, metrics: dict[str, float]) -> None:
            super().on_round_aggregated(trainer, pl_module, round_idx, metrics)
            version, unaligned = divmod(int(metrics["round/version"]), scale)  # in FedBuff aggregations
            if unaligned or (version % s.eval_every and version != s.aggregations):
                return
            correct = sample_metrics(pl_module, [(x_test, y_test)])["correct"].numpy()
            per_class = np.bincount(y_test.numpy(), weights=correct, minlength=10) / counts
            self.accuracy[version] = per_class.tolist()
            self.overall[version] = float(correct.mean())
            self.virtual_time[version] = float(metrics["round/virtual_time"])

    torch.manual_seed(spec.seed)
    in_features = int(x_test[0].numel())
    model = LogisticRegression(in_features=in_features, num_classes=10, lr=s.lr)
    algorithm = paper_algorithm(spec.algorithm, s.window, s.train_at, s.runtime)
    recorder = Recorder()
    trainer = FederatedTrainer(
        algorithm=algorithm, local_steps=s.local_steps, max_epochs=s.aggregations * scale, seed=spec.seed, callbacks=[recorder], **trainer_kwargs()
    )
    started, cpu_started = time.perf_counter(), time.process_time()
    trainer.fit(model, datamodule=data)
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    return RunResult(
        spec=spec,
        influence=algorithm.influence.tolist(),
        arrivals=[(float(t), int(c), int(v)) for t, c, v in trainer.fit_loop.arrivals],
        accuracy=recorder.accuracy,
        overall=recorder.overall,
        virtual_time=recorder.virtual_time,
        wall_s=wall,
        cpu_s=cpu,
        class_counts=counts.tolist(),
        first_ms=per_update_ms(recorder.marks, 0, scale * (s.aggregations // 10)),
        last_ms=per_update_ms(recorder.marks, scale * (s.aggregations - s.aggregations // 10) - 1, scale * s.aggregations - 1),
    )


def per_update_ms(marks: Sequence[tuple[int, float]], lo: int, hi: int) -> float:
    """CPU milliseconds per client update between aggregations ``lo`` and ``hi`` (0-based, after each)."""
    if len(marks) < 2:
        return float("nan")
    (u0, t0), (u1, t1) = marks[lo], marks[min(max(hi, lo + 1), len(marks) - 1)]
    return 1000 * (t1 - t0) / (u1 - u0)


# --------------------------------------------------------------------------------------------
# Plain NumPy reference: replays a trace with the notes' formulas (§2.5, §6.1 item 7)
# --------------------------------------------------------------------------------------------


def buffers(arrivals: Sequence[tuple[float, int, int]], b: int) -> list[tuple[list[int], list[int]]]:
    """``(clients, staleness)`` of each full buffer: the k-th buffer is arrivals ``k*b .. k*b+b-1``."""
    out = []
    for k in range(len(arrivals) // b):
        chunk = arrivals[k * b : (k + 1) * b]
        out.append(([c for _, c, _ in chunk], [k - v for _, _, v in chunk]))
    return out


def reference_influence(
    arrivals: Sequence[tuple[float, int, int]], *, variant: str, n: int, b: int, window: int, tracker: str = "window"
) -> np.ndarray:
    """Summed buffer weights per client: FedBuff ``1/b``, or FedStaleWeight's raw weight of the
    client's windowed mean staleness (recorded for the whole buffer, then read), normalised; with
    ``tracker="aflbench"`` a full window drops its newest value before the append, as afl-bench."""
    history: dict[int, list[int]] = {}
    influence = np.zeros(n)
    for clients, staleness in buffers(arrivals, b):
        if variant == "FedBuff":
            weights = np.full(b, 1.0 / b)
        else:
            for c, tau in zip(clients, staleness):
                values = history.setdefault(c, [])
                if tracker == "aflbench" and len(values) >= window:
                    values.pop()
                values.append(tau)
                del values[:-window]
            tau_bar = np.array([np.mean(history[c]) for c in clients])
            raw = {"eq8": (b * tau_bar + 1) / n, "alg1": (tau_bar + 1) / n, "aflbench": b * tau_bar / n}[variant]
            weights = raw / raw.sum() if raw.sum() > 0 else np.zeros(b)
        np.add.at(influence, clients, weights)
    return influence


def group_staleness(arrivals: Sequence[tuple[float, int, int]], b: int) -> tuple[float, float]:
    """Mean staleness of the aggregated updates of the fast and of the slow group."""
    fast, slow = [], []
    for clients, staleness in buffers(arrivals, b):
        for c, tau in zip(clients, staleness):
            (fast if c < NUM_FAST else slow).append(tau)
    return statistics.fmean(fast), statistics.fmean(slow)


def eq6() -> tuple[float, float, float, float]:
    """Eq. 6 expected staleness (fast, slow), FedBuff's slow-group share and virtual seconds per aggregation."""
    fast_rate, slow_rate = 1 / statistics.fmean(FAST_DELAY), 1 / statistics.fmean(SLOW_DELAY)
    total = NUM_FAST * fast_rate + NUM_SLOW * slow_rate
    return (total / fast_rate - 1) / BUFFER, (total / slow_rate - 1) / BUFFER, NUM_SLOW * slow_rate / total, BUFFER / total


# --------------------------------------------------------------------------------------------
# (c) wall-clock per client update, async vs sync
# --------------------------------------------------------------------------------------------


@dataclass
class Timing:
    mode: str
    updates: int
    wall_s: float
    cpu_s: float
    first: float  # CPU ms per update over the first tenth of the aggregations
    last: float  # CPU ms per update over the last tenth


def time_one(mode: str, aggregations: int, settings: Settings) -> Timing:
    """One ``fit`` of the async loop (FedStaleWeight) or the sync loop (FedAvg, 5 clients per round)."""
    import torch

    from fl_lightning import FedAvg, FederatedTrainer
    from fl_lightning.models import LogisticRegression

    data = paper_data(settings, 0)
    torch.manual_seed(0)
    model = LogisticRegression(in_features=64 if settings.data == "digits" else 20, num_classes=10, lr=settings.lr)
    algorithm = paper_algorithm("FedStaleWeight", settings.window) if mode == "async" else FedAvg(weighting="uniform")
    clock = UpdateClock()
    trainer = FederatedTrainer(
        algorithm=algorithm,
        clients_per_round=1.0 if mode == "async" else BUFFER,
        local_steps=settings.local_steps,
        max_epochs=aggregations,
        seed=0,
        callbacks=[clock],
        **trainer_kwargs(),
    )
    started, cpu_started = time.perf_counter(), time.process_time()
    trainer.fit(model, datamodule=data)
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    tenth = aggregations // 10
    return Timing(mode, clock.updates, wall, cpu, per_update_ms(clock.marks, 0, tenth), per_update_ms(clock.marks, aggregations - 1 - tenth, aggregations - 1))


# --------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------


def shares_table(results: list[RunResult], settings: Settings) -> list[str]:
    n = NUM_FAST + NUM_SLOW
    seeds = sorted({r.spec.seed for r in results})
    by = {(r.spec.algorithm, r.spec.seed): r for r in results}
    tau_fast, tau_slow, fedbuff_share, seconds = eq6()
    rows: dict[str, list[np.ndarray]] = {"FedBuff": [], "eq8": [], "alg1": [], "aflbench": []}
    check = 0.0
    paired = True
    staleness = []
    times = []
    for seed in seeds:
        trace = by[("FedBuff", seed)].arrivals
        paired &= trace == by[("FedStaleWeight", seed)].arrivals
        staleness.append(group_staleness(trace, BUFFER))
        times.append(trace[settings.aggregations * BUFFER - 1][0])
        for variant, values in rows.items():
            values.append(reference_influence(trace, variant=variant, n=n, b=BUFFER, window=settings.window, tracker=RUNTIMES[settings.runtime]["tracker"]))
        for name, variant in (("FedBuff", "FedBuff"), ("FedStaleWeight", "eq8")):
            check = max(check, float(np.abs(np.asarray(by[(name, seed)].influence) - rows[variant][-1]).max()))
        rows["FedBuff"][-1] = np.asarray(by[("FedBuff", seed)].influence)  # the loop's own numbers
        rows["eq8"][-1] = np.asarray(by[("FedStaleWeight", seed)].influence)
    labels = {
        "FedBuff": "FedBuff (loop)",
        "eq8": "FedStaleWeight `eq8`, default (loop)",
        "alg1": "FedStaleWeight `alg1` (replayed)",
        "aflbench": "FedStaleWeight `aflbench` (replayed)",
    }
    lines = [
        (f"**(a) Influence shares** ({settings.aggregations} aggregations, seeds {seeds}; share = client's summed "
         "buffer weights / total; mean ± std over seeds):"),
        "",
        "| Strategy | slow-group share | each fast client | each slow client | notes App. B (slow share, seed 0) |",
        "|---|---|---|---|---|",
    ]
    for variant, values in rows.items():
        shares = [v / v.sum() for v in values]
        lines.append(
            f"| {labels[variant]} | {mean_std([s[NUM_FAST:].sum() for s in shares], 4)} "
            f"| {mean_std([s[:NUM_FAST].mean() for s in shares], 4)} | {mean_std([s[NUM_FAST:].mean() for s in shares], 4)} "
            f"| {NOTES_SHARE[variant]:.4f} |"
        )
    lines += [
        (f"| Theory: FedBuff (Eq. 2) / mechanism ideal 1/n | {fedbuff_share:.4f} / {NUM_SLOW / n:.4f} | {(1 - fedbuff_share) / NUM_FAST:.4f} / {1 / n:.4f} "
         f"| {fedbuff_share / NUM_SLOW:.4f} / {1 / n:.4f} | |"),
        "",
        (f"Mean staleness of aggregated updates, fast / slow group: {mean_std([f for f, _ in staleness], 3)} / "
         f"{mean_std([s for _, s in staleness], 2)} (Eq. 6: {tau_fast:.3f} / {tau_slow:.2f}). Virtual time of the last "
         f"aggregation: {mean_std(times, 0)} s (Eq. 6: {settings.aggregations * seconds:.0f} s). FedBuff and FedStaleWeight "
         f"traces identical for every seed: {'yes' if paired else 'NO'}. NumPy reference replay vs the loop's "
         f"`influence`: max abs difference {check:.1e}."),
    ]
    return lines


def learning_table(results: list[RunResult], settings: Settings) -> list[str]:
    seeds = sorted({r.spec.seed for r in results})
    by = {(r.spec.algorithm, r.spec.seed): r for r in results}
    versions = sorted(by[("FedBuff", seeds[0])].accuracy)
    shown = [v for v in versions if v in report_versions(settings.aggregations)] or versions

    def slow(r: RunResult, v: int) -> float:
        acc, counts = np.asarray(r.accuracy[v]), np.asarray(r.class_counts)
        return float((acc * counts)[list(SLOW_LABELS)].sum() / counts[list(SLOW_LABELS)].sum())

    def fast(r: RunResult, v: int) -> float:
        acc, counts = np.asarray(r.accuracy[v]), np.asarray(r.class_counts)
        return float((acc * counts)[list(FAST_LABELS)].sum() / counts[list(FAST_LABELS)].sum())

    data = (
        "scikit-learn digits (1,437 train / 360 test, 8x8)" if settings.data == "digits" else "Gaussian blobs (d = 20, separation 1.0, 600 train / 200 test per class)"
    )
    lines = [
        (f"**(b) Learning**: {data}, softmax regression, SGD lr {settings.lr:g}, batch {settings.batch_size}, "
         f"Q = {settings.local_steps}; test accuracy of the global model (%), mean ± std over seeds {seeds}. "
         "Slow classes = 0-3 (held only by the slow clients), fast classes = 4-9. Equal aggregations are equal "
         "virtual time (paired traces)."),
        "",
        ("| aggregations | virtual time (s) | slow classes FedBuff | slow classes FedStaleWeight | fast classes FedBuff "
         "| fast classes FedStaleWeight | overall FedBuff | overall FedStaleWeight | Δ slow (FSW − FB) | Δ overall | seeds with Δ slow > 0 |"),
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for v in shown:
        fb = [by[("FedBuff", s)] for s in seeds]
        fsw = [by[("FedStaleWeight", s)] for s in seeds]
        d_slow = [slow(b, v) - slow(a, v) for a, b in zip(fb, fsw)]
        d_all = [b.overall[v] - a.overall[v] for a, b in zip(fb, fsw)]
        lines.append(
            f"| {v} | {statistics.fmean(r.virtual_time[v] for r in fb):.0f} "
            f"| {mean_std([slow(r, v) for r in fb], 1, 100)} | {mean_std([slow(r, v) for r in fsw], 1, 100)} "
            f"| {mean_std([fast(r, v) for r in fb], 1, 100)} | {mean_std([fast(r, v) for r in fsw], 1, 100)} "
            f"| {mean_std([r.overall[v] for r in fb], 1, 100)} | {mean_std([r.overall[v] for r in fsw], 1, 100)} "
            f"| {mean_std(d_slow, 1, 100)} | {mean_std(d_all, 1, 100)} | {sum(d > 0 for d in d_slow)}/{len(d_slow)} |"
        )
    return lines


def group_accuracy(result: RunResult, version: int, labels: Sequence[int]) -> float:
    """Test accuracy of ``result``'s global model at ``version`` on the classes ``labels``."""
    acc, counts = np.asarray(result.accuracy[version]), np.asarray(result.class_counts)
    return float((acc * counts)[list(labels)].sum() / counts[list(labels)].sum())


def fedasync_table(results: list[RunResult], settings: Settings) -> list[str]:
    """(d): FedAsync's influence and accuracy at FedBuff's aggregation points, beside FedBuff and FedStaleWeight."""
    seeds = sorted({r.spec.seed for r in results})
    by = {(r.spec.algorithm, r.spec.seed): r for r in results}
    names = ["FedBuff", "FedStaleWeight", *sorted({r.spec.algorithm for r in results if r.spec.algorithm.startswith("FedAsync")})]
    def events(r: RunResult) -> list[tuple[float, int]]:  # (time, client): pulled versions count differently
        return [(t, c) for t, c, _ in r.arrivals]

    paired = all(events(by[(name, s)]) == events(by[("FedBuff", s)]) for name in names for s in seeds)
    points = sorted({min(report_versions(settings.aggregations)), settings.aggregations})
    lines = [
        (f"**(d) FedAsync** (alpha 0.6; polynomial a = 0.5, hinge a = 10, b = 4), one update per arrival, on the traces of "
         f"(a)/(b) (identical to FedBuff's for every seed: {'yes' if paired else 'NO'}); at FedBuff aggregation k FedAsync "
         f"has made {BUFFER}k updates from the same arrivals. Mean ± std over seeds {seeds}; accuracies in %."),
        "",
        "| strategy | slow-group share | " + " | ".join(f"slow / fast / overall @ {k}" for k in points) + " |",
        "|---|---|" + "---|" * len(points),
    ]
    for name in names:
        runs = [by[(name, s)] for s in seeds]
        shares = [np.asarray(r.influence)[NUM_FAST:].sum() / np.sum(r.influence) for r in runs]
        cells = [
            f"{mean_std([group_accuracy(r, k, SLOW_LABELS) for r in runs], 1, 100)} / "
            f"{mean_std([group_accuracy(r, k, FAST_LABELS) for r in runs], 1, 100)} / {mean_std([r.overall[k] for r in runs], 1, 100)}"
            for k in points
        ]
        lines.append(f"| {name} | {mean_std(shares, 4)} | " + " | ".join(cells) + " |")
    return lines


def report_versions(aggregations: int) -> set[int]:
    return {v for v in (50, 100, 200, 500, 1000, 2000, 3000, 5000, 10000) if v < aggregations} | {aggregations}


def timing_table(timings: list[Timing], aggregations: int) -> list[str]:
    sync = [t for t in timings if t.mode == "sync"]
    asyn = [t for t in timings if t.mode == "async"]

    def med(values: list[float]) -> float:
        return statistics.median(values)

    rows = {
        "whole fit, CPU": (lambda t: 1000 * t.cpu_s / t.updates),
        "whole fit, wall": (lambda t: 1000 * t.wall_s / t.updates),
        f"first {max(1, aggregations // 10)} aggregations, CPU": (lambda t: t.first),
        f"last {max(1, aggregations // 10)} aggregations, CPU": (lambda t: t.last),
    }
    lines = [
        (f"**(c) Per client update**, async loop (FedStaleWeight, 15 clients in flight, b = 5) vs sync loop (FedAvg, "
         f"5 clients per round), {aggregations} aggregations / rounds, same model, data, batch and local step, "
         f"{len(sync)} alternated repeats each (median; the async loop trains {asyn[0].updates} updates, the sync loop "
         f"{sync[0].updates}):"),
        "",
        "| measure | sync ms/update | async ms/update | async / sync |",
        "|---|---|---|---|",
    ]
    for label, fn in rows.items():
        s, a = med([fn(t) for t in sync]), med([fn(t) for t in asyn])
        lines.append(f"| {label} | {s:.3f} | {a:.3f} | {a / s:.3f} |")
    return lines


def report(results: list[RunResult], timings: list[Timing], settings: Settings, args: argparse.Namespace, head: list[str]) -> str:
    lines = [
        *head,
        "",
        (f"Set-up (paper §6.2): 15 clients, 10 fast U{FAST_DELAY} holding labels 4-9 and 5 slow U{SLOW_DELAY} holding labels "
         f"0-3 (`LabelGroups` + `DelayGroups`), b = {BUFFER}, all clients in flight, pull policy "
         f"`{RUNTIMES[settings.runtime]['pull_policy']}`, {TRAIN_AT[settings.train_at]}, server lr 1, FedStaleWeight `eq8` with "
         f"{'a sliding window' if settings.runtime == 'paper' else 'afl-bench' + chr(39) + 's window (drops the newest when full)'} "
         f"of {settings.window}."),
        "",
        *shares_table(results, settings),
        "",
        *learning_table(results, settings),
    ]
    if args.fedasync:
        lines += ["", *fedasync_table(results, settings)]
    if timings:
        lines += ["", *timing_table(timings, args.timing_aggregations)]
    cpu = sum(r.cpu_s for r in results)
    tenth = settings.aggregations // 10
    lines += [
        "",
        (f"Inside the {settings.aggregations}-aggregation async runs of (a)/(b) (all {len(results)}, in parallel workers, "
         f"with the evaluation every {settings.eval_every}): CPU ms per client update over the first {tenth} aggregations "
         f"{mean_std([r.first_ms for r in results], 3)}, over the last {tenth} {mean_std([r.last_ms for r in results], 3)}."),
        (f"(a)/(b) per run: {statistics.fmean(r.wall_s for r in results):.1f} s wall, {statistics.fmean(r.cpu_s for r in results):.1f} s CPU "
         f"(mean of {len(results)} runs, {cpu:.0f} CPU-seconds in all)."),
    ]
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="~1-2 minute smoke run (300 aggregations, 2 seeds, short timing)")
    parser.add_argument("--data", default="digits", choices=["digits", "blobs"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--aggregations", type=int, default=3000, help="N, server aggregations per run of (a)/(b)")
    parser.add_argument("--eval-every", type=int, default=50, help="evaluate the global model every K aggregations")
    parser.add_argument("--lr", type=float, default=0.05, help="client SGD learning rate (the paper: 0.01)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--local-steps", type=int, default=1, help="Q")
    parser.add_argument("--window", type=int, default=5, help="FedStaleWeight's staleness window")
    parser.add_argument(
        "--runtime",
        default="paper",
        choices=list(RUNTIMES),
        help="paper: clients re-pull at once, true sliding window; aflbench: wait_new_version and afl-bench's window (see RUNTIMES)",
    )
    parser.add_argument("--fedasync", nargs="*", default=[], choices=sorted(FEDASYNC), help="(d): FedAsync with these staleness functions")
    parser.add_argument(
        "--train-at", default="dispatch", choices=list(TRAIN_AT), help="which model a client trains on (FedBuff's train_at)"
    )
    parser.add_argument("--timing-aggregations", type=int, default=1000, help="aggregations / rounds per fit of (c); 0 skips (c)")
    parser.add_argument("--timing-repeats", type=int, default=2)
    add_worker_arguments(parser)  # --jobs runs (a)/(b)
    args = parser.parse_args(argv)
    if args.quick:
        args.aggregations, args.seeds, args.timing_aggregations, args.timing_repeats = 300, [0, 1], 200, 1
    if args.aggregations < 1 or args.eval_every < 1:
        parser.error("--aggregations and --eval-every must be >= 1.")
    return args


def progress_line(result: RunResult) -> str:
    """One line per finished run."""
    aggregations = result.spec.settings.aggregations
    final = result.accuracy[aggregations]
    share = np.asarray(result.influence)
    return (
        f"{result.spec.algorithm} seed={result.spec.seed}: slow share {share[NUM_FAST:].sum() / share.sum():.4f}, "
        f"slow-class acc {statistics.fmean(final[c] for c in SLOW_LABELS):.3f}, overall {result.overall[aggregations]:.3f} "
        f"({result.wall_s:.1f} s wall, {result.cpu_s:.1f} s CPU)"
    )

def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    settings = Settings(
        data=args.data,
        aggregations=args.aggregations,
        eval_every=args.eval_every,
        lr=args.lr,
        batch_size=args.batch_size,
        local_steps=args.local_steps,
        window=args.window,
        runtime=args.runtime,
        train_at=args.train_at,
    )
    names = [*ALGORITHMS, *(f"FedAsync-{staleness}" for staleness in args.fedasync)]
    specs = [RunSpec(name, seed, settings) for seed in args.seeds for name in names]
    print(asdict(settings), flush=True)
    started, load_before = time.perf_counter(), load()
    results = run_in_workers(run_one, specs, args, progress_line)
    timings: list[Timing] = []
    if args.timing_aggregations > 0:
        init_worker(args.threads)
        for _ in range(args.timing_repeats):
            for mode in ("sync", "async"):
                timing = time_one(mode, args.timing_aggregations, settings)
                print(f"timing {mode}: {timing.updates} updates, {timing.cpu_s:.1f} s CPU, {timing.wall_s:.1f} s wall", flush=True)
                timings.append(timing)
    text = report(results, timings, settings, args, header(started, load_before, workers=args.jobs, threads=args.threads))
    print()
    emit(text, args.out)


if __name__ == "__main__":
    main()
