"""Schemes A/B/C of flexible device participation on Synthetic(1, 1) (Ruan et al., AISTATS 2021, §5.2).

Reproduces the paper's qualitative result: with heterogeneous participation (devices assigned
traces of different completion rates, some with inactivity), the debiased scheme C reaches a
lower test loss than scheme B (accept partial work, fixed weights) and scheme A (drop
incomplete devices). Every run goes through the real :class:`~fl_lightning.FederatedTrainer`
with :class:`~fl_lightning.FlexibleParticipation` and
:class:`~fl_lightning.participation.TraceParticipation` (our substitute for the paper's
unpublished traces, see ``fl_lightning/participation/traces.py``).

Per seed, the dataset (FedProx generator), the trace assignment, the clients' batch order and
the model initialisation all change; within a seed the three schemes see exactly the same data,
the same traces and the same per-round completed steps ``s_k``, so the comparison is paired.

``--experiment arrival|departure`` runs the paper's Tables 4-5 instead (§5.3-5.4): one device
arrives (fast-reboot vs vanilla reboot) or departs (exclude vs include) at round tau0; see
``flexible_events.py``.

Reported per (|T|, scheme): mean ± sample std over seeds of the final test loss and accuracy
(global model after the last round, on the pooled test split of all devices) and of the mean
test loss over the last ``--tail`` rounds; then the paired differences C - B and C - A with the
number of seeds where C is lower.

Run from the repository root::

    PYTHONPATH=. python benchmarks/flexible_participation.py            # default: 30 runs, ~900 CPU-s (~8 min on 2 idle cores)
    PYTHONPATH=. python benchmarks/flexible_participation.py --quick    # ~1 min smoke run (6 small runs)
    PYTHONPATH=. python benchmarks/flexible_participation.py --paper    # Table 3's size: 50 devices, 200 rounds, |T| = 1-8
    PYTHONPATH=. python benchmarks/flexible_participation.py --experiment arrival     # Table 4 (~3 min CPU)
    PYTHONPATH=. python benchmarks/flexible_participation.py --experiment departure   # Table 5 at (1, 1), every other tau0 (~6 min)
    PYTHONPATH=. python benchmarks/flexible_participation.py --experiment departure --paper  # all of Table 5 (~40 min)
    PYTHONPATH=. python benchmarks/flexible_participation.py --out table.md --jobs 1

Runs are spread over ``--jobs`` worker processes (default: the number of CPU cores, at most
the number of runs), each with one torch thread: on a 2-core VM torch's default intra-op
threads made a round of this model ~10x slower. The report gives each run's CPU time as well
as its wall time, because on a shared machine the wall time mostly measures the other load.
Results are deterministic: a rerun gives the same losses to the last digit.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import lightning.pytorch as pl
from flexible_events import EVENT_SAMPLES, EVENT_SCHEME, EVENT_TRACES, HOLDOUT, VARIANTS, Event, arrival_table, departure_table
from harness import QUIET_VALIDATING
from reporting import emit, header, load, mean_std  # benchmarks/ is on sys.path when run as a script
from workers import add_worker_arguments, run_in_workers

SCHEMES = ("A", "B", "C")
#: Arrival: the paper's tau0 (Table 4); departure: every other tau0 of Table 5 at (1, 1). Horizons cover
#: the paper's largest SYNTHETIC recovery (12 rounds) and most of its crossings (Table 5).
EVENT_DEFAULTS: dict[str, dict[str, Any]] = {
    "arrival": {"event_rounds": [10, 30, 50, 70], "horizon": 30},
    "departure": {"event_rounds": [10, 20, 30, 40, 50], "horizon": 60},
}
#: ``--paper``: the paper's sizes (longer than 15 min on 2 cores; the arrival default already is the paper's).
PAPER: dict[str, dict[str, Any]] = {
    "schemes": {"devices": 50, "rounds": 200, "traces": list(range(8, 0, -1)), "seeds": [0, 1, 2]},
    "departure": {
        "event_rounds": list(range(10, 55, 5)),
        "horizon": 100,
        "noniid": [(0.1, 0.1), (0.5, 0.5), (1.0, 1.0)],
    },
}


@dataclass(frozen=True)
class Settings:
    """One benchmark configuration (shared by all its runs)."""

    devices: int
    rounds: int
    local_steps: int
    batch_size: int
    lr: float
    alpha: float
    beta: float
    tail: int
    rounding: str
    samples_per_client: int | None  # None: the FedProx generator's lognormal sizes
    restart: float = 1.0  # StaircaseLR's restart share at an objective shift (1: the paper's restart to eta_0)


@dataclass(frozen=True)
class RunSpec:
    scheme: str
    num_traces: int
    seed: int
    settings: Settings
    event: Event | None = None  # an arrival or departure (``--experiment arrival|departure``)
    horizon: int = 0  # rounds after the event

    @property
    def rounds(self) -> int:
        return self.settings.rounds if self.event is None else self.event.round + self.horizon

    @property
    def first_evaluated(self) -> int:
        """The first round evaluated: the tail, or the round before the event."""
        return self.rounds - self.settings.tail if self.event is None else self.event.round - 1


@dataclass
class RunResult:
    spec: RunSpec
    final_loss: float
    final_acc: float
    tail_loss: float
    complete_fraction: float  # mean over rounds of (complete devices / devices)
    inactive_fraction: float
    discarded_rounds: int
    wall_s: float
    cpu_s: float  # CPU time of the worker process during the run (not inflated by other processes)
    losses: list[float] = field(default_factory=list)  # test loss after each evaluated round
    accs: list[float] = field(default_factory=list)  # test accuracy after each evaluated round


def run_one(spec: RunSpec) -> RunResult:
    """Trains one (scheme, |T|, seed) configuration through ``FederatedTrainer``."""
    import functools

    import torch

    from fl_lightning import FederatedCallback, FederatedTrainer, FlexibleParticipation
    from fl_lightning.data import FederatedDataModule, FedProxSynthetic, Natural
    from fl_lightning.models import LogisticRegression
    from fl_lightning.participation import TraceParticipation
    from fl_lightning.models.schedulers import StaircaseLR

    s = spec.settings
    num_rounds, first = spec.rounds, spec.first_evaluated

    class Recorder(FederatedCallback):
        """Test metrics after each evaluated round, and the round's participation counts."""

        def __init__(self) -> None:
            self.loss: list[float] = []
            self.acc: list[float] = []
            self.rounds: list[dict[str, float]] = []

        def on_round_aggregated(
            self, trainer: pl.Trainer, pl_module: pl.LightningModule, round_idx: int, metrics: dict[str, float]
        ) -> None:
            self.rounds.append(dict(metrics))
            if round_idx >= first:
                self.loss.append(float(trainer.callback_metrics["val_loss"]))
                self.acc.append(float(trainer.callback_metrics["val_acc"]))

    class TailValidation(pl.Callback):
        """Server evaluation from ``first`` on only: the benchmark needs no earlier curve."""

        def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
            trainer.check_val_every_n_epoch = 1 if trainer.current_epoch >= first else num_rounds + 1

    def synthetic(split: str) -> FedProxSynthetic:
        return FedProxSynthetic(
            alpha=s.alpha,
            beta=s.beta,
            num_clients=s.devices,
            split=split,
            seed=spec.seed,
            samples_per_client=s.samples_per_client,
        )

    test = synthetic("test")
    data = FederatedDataModule(
        synthetic("train"),
        test,
        # The paper reports the test metrics of its last rounds: no model selection happens, so the
        # server "validates" on the test set, explicitly (docs/evaluation.md).
        val=test,
        partitioner=Natural(),
        num_clients=s.devices,
        batch_size=s.batch_size,
        # With events the server evaluates on the held-out data of the objective's devices (FlexibleParticipation).
        holdout_fraction=HOLDOUT if spec.event else 0.0,
        seed=spec.seed,
    )
    torch.manual_seed(spec.seed)
    model = LogisticRegression(in_features=60, num_classes=10, lr=s.lr, lr_scheduler=functools.partial(StaircaseLR, restart=s.restart))
    algorithm = FlexibleParticipation(
        scheme=spec.scheme,  # type: ignore[arg-type]
        participation=TraceParticipation(num_traces=spec.num_traces, rounding=s.rounding),  # type: ignore[arg-type]
        **(spec.event.algorithm_kwargs(s.devices) if spec.event else {}),
    )
    recorder = Recorder()
    trainer = FederatedTrainer(
        algorithm=algorithm,
        local_steps=s.local_steps,
        max_epochs=num_rounds,
        seed=spec.seed,
        accelerator="cpu",
        devices=1,
        callbacks=[recorder, TailValidation()],
        **QUIET_VALIDATING,
    )
    started, cpu_started = time.perf_counter(), time.process_time()
    trainer.fit(model, datamodule=data)
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    rounds = recorder.rounds
    return RunResult(
        spec=spec,
        final_loss=recorder.loss[-1],
        final_acc=recorder.acc[-1],
        tail_loss=statistics.fmean(recorder.loss[-s.tail :]),
        complete_fraction=statistics.fmean(r["round/complete_clients"] / s.devices for r in rounds),
        inactive_fraction=statistics.fmean(r["round/inactive_clients"] / s.devices for r in rounds),
        discarded_rounds=int(sum(r["round/discarded"] for r in rounds)),
        wall_s=wall,
        cpu_s=cpu,
        losses=recorder.loss,
        accs=recorder.acc,
    )


# --------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------


def common_settings(settings: Settings) -> str:
    """The model, optimiser and learning rate every experiment shares."""
    return (
        f"multinomial logistic regression 60 -> 10, plain SGD, batch {settings.batch_size}, E = {settings.local_steps} "
        f"local steps, eta_tau = {settings.lr:g} / tau (StaircaseLR, restarted at an objective shift"
        f"{' to eta_0, the paper' if settings.restart == 1 else f' by a share {settings.restart:g} of the rounds since the last one'})"
    )


def footer(results: list[RunResult], args: argparse.Namespace) -> list[str]:
    """CPU and wall time of the runs."""
    cpu = sum(r.cpu_s for r in results)
    return [
        "",
        (
            f"Per run (mean): {statistics.fmean(r.wall_s for r in results):.1f} s wall, "
            f"{statistics.fmean(r.cpu_s for r in results):.1f} s CPU; all runs: {cpu:.0f} CPU-seconds, i.e. about "
            f"{cpu / args.jobs:.0f} s of wall time on {args.jobs} idle core(s)."
        ),
    ]


def events_report(results: list[RunResult], settings: Settings, args: argparse.Namespace, head: list[str]) -> str:
    """Table 4 (arrival) or Table 5 (departure) and the settings."""
    seeds = sorted({r.spec.seed for r in results})
    event = "an arrival (fast-reboot or vanilla reboot)" if args.experiment == "arrival" else "a departure (exclude or include)"
    table = arrival_table if args.experiment == "arrival" else departure_table
    return "\n".join(
        [
            *head,
            "",
            (
                f"Settings: Synthetic(alpha, beta) (FedProx generator, {settings.samples_per_client} samples per device, "
                f"90/10 train/test per device, {HOLDOUT:.0%} of each device's train split held out as its test data), "
                f"{settings.devices} devices, the last one with {event} at round tau0 (0-based), {args.horizon} rounds "
                f"after it; scheme {EVENT_SCHEME}, TraceParticipation of the first {EVENT_TRACES} traces; "
                f"{common_settings(settings)}; seeds {seeds}. Test metrics of the global model after each round on the "
                "held-out data of the devices in the objective then. Rounds are counted from tau0 inclusive (1 = after "
                "the first round with the new objective); `>H` = not within the horizon."
            ),
            "",
            *table(results, args.horizon),
            *footer(results, args),
        ]
    )


def report(results: list[RunResult], settings: Settings, args: argparse.Namespace, head: list[str]) -> str:
    by = {(r.spec.num_traces, r.spec.scheme, r.spec.seed): r for r in results}
    traces = sorted({r.spec.num_traces for r in results}, reverse=True)
    schemes = [s for s in SCHEMES if any(r.spec.scheme == s for r in results)]
    seeds = sorted({r.spec.seed for r in results})
    sizes = (
        "lognormal sizes"
        if settings.samples_per_client is None
        else f"{settings.samples_per_client} samples per device"
    )
    lines = [
        *head,
        "",
        (
            f"Settings: Synthetic({settings.alpha:g}, {settings.beta:g}) (FedProx generator, {sizes}, 90/10 "
            f"train/test per device), {settings.devices} devices (all train every round), "
            f"{common_settings(settings)}, {settings.rounds} rounds, TraceParticipation "
            f"(PAPER_TRACE_SUBSTITUTE, rounding={settings.rounding!r}); seeds {seeds}. Final = global model after "
            f"the last round on the pooled test split; tail = mean test loss over the last {settings.tail} rounds."
        ),
        "",
        "| \\|T\\| | scheme | final test loss | final test acc | tail test loss | complete / inactive devices per round | discarded rounds |",
        "|---|---|---|---|---|---|---|",
    ]
    for t in traces:
        for scheme in schemes:
            runs = [by[(t, scheme, seed)] for seed in seeds if (t, scheme, seed) in by]
            lines.append(
                f"| {t} | {scheme} | {mean_std([r.final_loss for r in runs])} | {mean_std([r.final_acc for r in runs])} "
                f"| {mean_std([r.tail_loss for r in runs])} "
                f"| {statistics.fmean(r.complete_fraction for r in runs):.0%} / {statistics.fmean(r.inactive_fraction for r in runs):.0%} "
                f"| {statistics.fmean(r.discarded_rounds for r in runs):.1f} |"
            )
    if "C" in schemes:
        lines += [
            "",
            "Paired differences (same seed: same data, traces and completed steps), final test loss:",
            "",
            "| \\|T\\| | C - B | C lower than B | C - A | C lower than A |",
            "|---|---|---|---|---|",
        ]
        for t in traces:
            cells = [str(t)]
            for other in ("B", "A"):
                pairs = [
                    (by[(t, "C", s)], by[(t, other, s)]) for s in seeds if (t, "C", s) in by and (t, other, s) in by
                ]
                if not pairs:
                    cells += ["-", "-"]
                    continue
                diffs = [c.final_loss - o.final_loss for c, o in pairs]
                cells += [mean_std(diffs), f"{sum(d < 0 for d in diffs)}/{len(diffs)}"]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines + footer(results, args))


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument(
        "--experiment",
        default="schemes",
        choices=["schemes", *VARIANTS],
        help="schemes A/B/C (Table 3), an arrival with or without fast-reboot (Table 4), or a departure (Table 5)",
    )
    parser.add_argument("--paper", action="store_true", help="the paper's full settings (longer than 15 min; see PAPER)")
    parser.add_argument("--quick", action="store_true", help="~1 minute smoke run (small, 2 seeds, |T| = 8 only)")
    parser.add_argument("--schemes", nargs="+", default=list(SCHEMES), choices=SCHEMES, help="aggregation schemes")
    parser.add_argument("--traces", nargs="+", type=int, default=[8, 5], help="the paper's |T| values")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4], help="data, traces, batches and init")
    parser.add_argument("--devices", type=int, default=30, help="devices (all train every round)")
    parser.add_argument("--rounds", type=int, default=100, help="rounds (the paper: 200)")
    parser.add_argument("--local-steps", type=int, default=10, help="E (the paper does not state it)")
    parser.add_argument("--batch-size", type=int, default=20, help="local batch size")
    parser.add_argument("--lr", type=float, default=1.0, help="eta_0 of eta_tau = eta_0 / tau")
    parser.add_argument(
        "--restart", type=float, default=1.0, help="events: StaircaseLR's restart share (1: the paper's restart to eta_0; 0: none)"
    )
    parser.add_argument("--alpha", type=float, default=1.0, help="Synthetic(alpha, beta)")
    parser.add_argument("--beta", type=float, default=1.0, help="Synthetic(alpha, beta)")
    parser.add_argument(
        "--rounding", default="round", choices=["round", "floor", "ceil"], help="s = rounding(pct * E / 100)"
    )
    parser.add_argument(
        "--samples-per-client",
        type=int,
        help=f"equal device sizes (p_k = 1/N) instead of the generator's lognormal ones (events: {EVENT_SAMPLES})",
    )
    parser.add_argument("--tail", type=int, default=10, help="evaluate the global model in the last TAIL rounds")
    parser.add_argument("--event-rounds", nargs="+", type=int, help="tau0 of the arrival / departure (default: EVENT_DEFAULTS)")
    parser.add_argument("--horizon", type=int, help="rounds run after tau0 (default: EVENT_DEFAULTS)")
    parser.add_argument(
        "--noniid",
        nargs="+",
        type=noniid_pair,
        help="departure: Synthetic(alpha, beta) pairs as ALPHA,BETA (default: --alpha,--beta)",
    )
    add_worker_arguments(parser)
    args = parser.parse_args(argv)
    if args.experiment != "schemes":
        for key, value in EVENT_DEFAULTS[args.experiment].items():
            if getattr(args, key) is None:
                setattr(args, key, value)
        args.noniid = args.noniid or [(args.alpha, args.beta)]
        args.samples_per_client = args.samples_per_client or EVENT_SAMPLES
    if args.paper:
        if args.experiment not in PAPER:
            parser.error(f"--paper: the default {args.experiment} experiment already has the paper's settings.")
        vars(args).update(PAPER[args.experiment])
    if args.quick:
        args.devices, args.rounds, args.seeds, args.traces, args.tail = 20, 30, [0, 1], [8], 5
        args.event_rounds, args.horizon = [10], 10
    bound = args.rounds if args.experiment == "schemes" else args.horizon + 1
    if args.tail < 1 or args.tail > bound:
        parser.error(f"--tail must be in [1, {bound}] (the evaluated rounds), got {args.tail}.")
    if args.experiment != "schemes" and min(args.event_rounds) < 1:
        parser.error(f"--event-rounds must be >= 1 (the round before the event is the reference), got {args.event_rounds}.")
    return args


def noniid_pair(text: str) -> tuple[float, float]:
    """``"ALPHA,BETA"`` -> (alpha, beta)."""
    try:
        alpha, beta = (float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected ALPHA,BETA (e.g. 0.5,0.5), got {text!r}") from None
    return alpha, beta


def progress_line(result: RunResult) -> str:
    """One line per finished run."""
    sp = result.spec
    event = f" {sp.event.kind} at {sp.event.round} ({sp.event.variant}, alpha={sp.settings.alpha:g})" if sp.event else ""
    return (
        f"|T|={sp.num_traces} scheme={sp.scheme} seed={sp.seed}{event}: final loss {result.final_loss:.4f} "
        f"acc {result.final_acc:.4f} tail loss {result.tail_loss:.4f} ({result.wall_s:.1f} s wall, {result.cpu_s:.1f} s CPU)"
    )

def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    settings = Settings(
        devices=args.devices,
        rounds=args.rounds,
        local_steps=args.local_steps,
        batch_size=args.batch_size,
        lr=args.lr,
        alpha=args.alpha,
        beta=args.beta,
        tail=args.tail,
        rounding=args.rounding,
        samples_per_client=args.samples_per_client,
        restart=args.restart,
    )
    if args.experiment == "schemes":
        specs = [RunSpec(scheme, t, seed, settings) for t in args.traces for seed in args.seeds for scheme in args.schemes]
    else:
        specs = [
            RunSpec(
                EVENT_SCHEME,
                EVENT_TRACES,
                seed,
                replace(settings, alpha=alpha, beta=beta),
                Event(args.experiment, tau0, variant),
                args.horizon,
            )
            for alpha, beta in args.noniid
            for tau0 in args.event_rounds
            for seed in args.seeds
            for variant in VARIANTS[args.experiment]
        ]
    print(asdict(settings), flush=True)
    started, load_before = time.perf_counter(), load()
    results = run_in_workers(run_one, specs, args, progress_line)
    write = report if args.experiment == "schemes" else events_report
    text = write(results, settings, args, header(started, load_before, workers=args.jobs, threads=args.threads))
    print()
    emit(text, args.out)


if __name__ == "__main__":
    main()
