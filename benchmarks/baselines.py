"""The issue-28 baselines side by side, and the orderings their papers report, checked (issue 28).

Runs the two shipped studies (each ``(arm, seed)`` a plain ``fl-lightning fit`` process):

- ``configs/studies/baselines_digits.yaml``: scikit-learn's digits under Dirichlet(0.1) label skew;
  FedAvg, FedProx, FedAdam, SCAFFOLD, FedDyn, FedNova, q-FedAvg, Ditto on the quickstart's MLP, and
  FedBN beside FedAvg on the BatchNorm CNN (``fedavg_bn``);
- ``configs/studies/baselines_synthetic.yaml``: FedProx's Synthetic(1, 1), power-law device sizes, so a
  fixed number of local epochs gives heterogeneous local steps (FedNova's setting).

and reports per arm the mean ± std over seeds of the final validation accuracy (global model), rounds to
the study's target, the worst-10 % and mean client accuracy on the clients' own held-out data (global
model; personalised models for Ditto and FedBN), then each paper's claim as a paired difference over
seeds with the benchmarks' one significance rule (:func:`reporting.significance`).

    PYTHONPATH=. python benchmarks/baselines.py --workers 2 --out benchmarks/results/baselines.md
    PYTHONPATH=. python benchmarks/baselines.py --seeds 0 --rounds 5          # smoke run
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from collections.abc import Sequence
from pathlib import Path

from reporting import emit, header, load, mean_std, significance  # benchmarks/ is on sys.path as a script

from fl_lightning.study.compare import StudyResult, run_study
from fl_lightning.study.runner import DONE
from fl_lightning.study.spec import expand_dotted, load_study, merge

STUDIES = Path(__file__).resolve().parents[1] / "configs" / "studies"
#: Summary keys of the report's columns (``<reduction>/<metric>``, as the study names them), with their headers.
COLUMNS = {
    "final/val_acc": "val acc (final)",
    "rounds_to_target": "rounds to target",
    "final/clients/acc_mean": "client acc mean",
    "final/clients/acc_worst10": "client acc worst-10 %",
    "final/clients/personal/acc_mean": "personal acc mean",
    "final/clients/personal/acc_worst10": "personal acc worst-10 %",
}
#: The claims checked, per study: (arm, reference arm, summary key, what the paper reports).
CLAIMS = {
    "baselines_digits": [
        ("scaffold", "fedavg", "final/val_acc", "SCAFFOLD beats FedAvg under strong label skew (Karimireddy et al. 2020, Table 3)"),
        ("feddyn", "fedavg", "final/val_acc", "FedDyn beats FedAvg under strong label skew (Acar et al. 2021, Table 2)"),
        ("fedprox", "fedavg", "final/val_acc", "FedProx is at least FedAvg's accuracy on heterogeneous data (Li et al. 2020)"),
        ("qffl", "fedavg", "final/clients/acc_worst10", "q > 0 raises the worst clients' accuracy (Li et al. 2020, Table 1)"),
        ("qffl_l1", "fedavg", "final/clients/acc_worst10", "the same with L = 1 instead of 1/lr"),
        ("ditto", "fedavg", ("final/clients/personal/acc_mean", "final/clients/acc_mean"),
         "Ditto's personalised models beat the global model on the clients' own data (Li et al. 2021, Table 1)"),
        ("fedbn", "fedavg_bn", ("final/clients/personal/acc_mean", "final/clients/acc_mean"),
         "FedBN's local BatchNorm beats FedAvg on the clients' own data (Li et al. 2021, Table 2; feature shift there, label skew here)"),
    ],
    "baselines_synthetic": [
        ("fednova", "fedavg", "final/val_acc", "FedNova beats FedAvg with heterogeneous local steps (Wang et al. 2020, Table 1)"),
        ("scaffold", "fedavg", "final/val_acc", "SCAFFOLD beats FedAvg on heterogeneous clients (Karimireddy et al. 2020)"),
        ("feddyn", "fedavg", "final/val_acc", "FedDyn beats FedAvg on heterogeneous clients (Acar et al. 2021)"),
        ("fedprox", "fedavg", "final/val_acc", "FedProx (mu = 1) beats FedAvg on Synthetic(1, 1) (Li et al. 2020, Fig. 2)"),
        ("qffl", "fedavg", "final/clients/acc_worst10", "q > 0 raises the worst clients' accuracy (Li et al. 2020)"),
        ("qffl_l1", "fedavg", "final/clients/acc_worst10", "the same with L = 1 instead of 1/lr"),
    ],
}


def run(name: str, args: argparse.Namespace) -> StudyResult:
    spec = load_study(STUDIES / f"{name}.yaml")
    overrides = {"trainer.max_epochs": args.rounds} if args.rounds else {}
    spec = dataclasses.replace(
        spec,
        seeds=tuple(args.seeds) if args.seeds else spec.seeds,
        workers=args.workers,
        overrides=merge(spec.overrides, expand_dotted(overrides)),
        directory=Path(args.directory) / name,
        wandb=None,
        plots=False,
    )
    return run_study(spec)


def value(record, key: str | tuple[str, str]) -> float | None:  # noqa: ANN001 (a RunRecord)
    """The run's summary value of ``key``; a pair ``(a, b)`` reads ``a`` for this arm and ``b`` for the reference."""
    return record.summary.get(key if isinstance(key, str) else key[0])


def table(result: StudyResult) -> list[str]:
    lines = ["| arm | runs | " + " | ".join(COLUMNS.values()) + " |", "|---" * (len(COLUMNS) + 2) + "|"]
    for arm in dict.fromkeys(r.arm for r in result.records):
        done = [r for r in result.records if r.arm == arm and r.status == DONE]
        cells = []
        for key in COLUMNS:
            values = [v for r in done if (v := r.summary.get(key)) is not None]
            digits = 1 if key == "rounds_to_target" else 3
            reached = f" ({len(values)}/{len(done)})" if key == "rounds_to_target" and len(values) < len(done) else ""
            cells.append((mean_std(values, digits) + reached) if values else "–")
        lines.append(f"| {arm} | {len(done)}/{sum(r.arm == arm for r in result.records)} | " + " | ".join(cells) + " |")
    return lines


def claims(name: str, result: StudyResult) -> list[str]:
    lines = [
        "| claim | arm − reference (per seed) | seeds in the claim's direction | mean | 95 % CI, significant | holds? |",
        "|---|---|---|---|---|---|",
    ]
    by_run = {(r.arm, r.seed): r for r in result.records if r.status == DONE}
    for arm, reference, key, claim in CLAIMS[name]:
        mine, theirs = (key, key) if isinstance(key, str) else key
        diffs = [
            by_run[(arm, s)].summary[mine] - by_run[(reference, s)].summary[theirs]  # type: ignore[operator]
            for s in sorted({s for a, s in by_run if a == arm})
            if (reference, s) in by_run
            and by_run[(arm, s)].summary.get(mine) is not None
            and by_run[(reference, s)].summary.get(theirs) is not None
        ]
        if not diffs:
            lines.append(f"| {claim} | – | – | – | – | not measured |")
            continue
        ci = significance(diffs)
        mean = sum(diffs) / len(diffs)
        verdict = "yes" if mean > 0 and ci.endswith("yes") else ("no: significantly worse" if mean < 0 and ci.endswith("yes") else "not significant")
        ahead = f"{sum(d > 0 for d in diffs)}/{len(diffs)}"
        lines.append(f"| {claim} | {', '.join(f'{d:+.3f}' for d in diffs)} | {ahead} | {mean:+.3f} | {ci} | {verdict} |")
    return lines


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--studies", nargs="+", default=list(CLAIMS), choices=list(CLAIMS))
    parser.add_argument("--seeds", type=int, nargs="+", help="seeds (default: each study's)")
    parser.add_argument("--rounds", type=int, help="rounds (default: each study's)")
    parser.add_argument("--workers", type=int, default=2, help="runs in flight at once")
    parser.add_argument("--directory", default="studies", help="where the studies' runs go (re-running finishes what is missing)")
    parser.add_argument("--out", help="also write the Markdown report to this file")
    args = parser.parse_args(argv)
    started, load_before = time.perf_counter(), load()
    sections = []
    for name in args.studies:
        result = run(name, args)
        failed = [f"{r.arm} seed {r.seed}: {r.error}" for r in result.failed]
        sections += [f"### {name}", "", f"`configs/studies/{name}.yaml`; study directory `{result.directory}`.", "",
                     *table(result), "", *claims(name, result), "", *(f"- failed: {f}" for f in failed), ""]
    emit("\n".join(["## Baselines (issue 28)", "", *header(started, load_before, workers=args.workers), "", *sections]), args.out)


if __name__ == "__main__":
    main()
