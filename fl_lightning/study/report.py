"""The study's summary: per-arm mean ± std over seeds, as Markdown and CSV, from the runs' CSV logs."""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from fl_lightning.study.metrics import (
    History,
    algorithm_class_path,
    algorithm_metrics,
    byte_unit,
    mean_std,
    metrics_files,
    read_history,
    summarize_run,
    validation_keys,
)
from fl_lightning.study.runner import DONE, FAILED, Run, RunState
from fl_lightning.study.spec import StudySpec, load_yaml


@dataclass
class RunRecord:
    """A run's status and, from its CSV logs, its history and summary numbers."""

    arm: str
    seed: int
    status: str
    error: str | None
    wall_clock_s: float
    attempts: int
    history: History = field(default_factory=list)
    summary: dict[str, float | None] = field(default_factory=dict)
    #: The summary keys of the run's validation metrics (:func:`~fl_lightning.study.metrics.validation_keys`).
    scores: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Column:
    """A summary-table column: the summary key it averages, its header and how values print."""

    key: str
    label: str
    kind: str = "score"  # score | rounds | bytes | seconds | number


def collect(spec: StudySpec, runs: Sequence[Run]) -> list[RunRecord]:
    """Reads every run's state and CSV logs."""
    records = []
    for run in runs:
        state = RunState.load(run)
        files = metrics_files(run.csv_dir)
        metrics = [*_algorithm_metrics(files), *spec.metrics.items()]
        history = read_history(files)
        validation, monitor, mode = reported_metrics(spec, run)
        records.append(
            RunRecord(
                arm=run.arm.name,
                seed=run.seed,
                status=state.status,
                error=state.error,
                wall_clock_s=state.wall_clock_s,
                attempts=len(state.attempts),
                history=history,
                summary={
                    **summarize_run(
                        history, validation=validation, monitor=monitor, mode=mode, target=spec.target_accuracy, metrics=metrics
                    ),
                    "wall_clock_s": state.wall_clock_s,
                },
                scores=validation_keys(validation, monitor),
            )
        )
    return records


def reported_metrics(spec: StudySpec, run: Run) -> tuple[list[str], str | None, str]:
    """The run's validation metrics, monitor and mode: the study's ``monitor``/``mode``, else the
    run's first ``ModelCheckpoint``/``EarlyStopping`` monitor, as its completion marker recorded them."""
    marker = json.loads(run.marker.read_text()) if run.marker.is_file() else {}
    validation = list(marker.get("validation_metrics", []))
    if spec.monitor is not None:
        return validation, spec.monitor, spec.mode or "max"
    monitors: dict[str, str] = marker.get("monitors", {})
    monitor = next(iter(monitors), None)
    return validation, monitor, monitors.get(monitor or "", "max")


def _algorithm_metrics(files: Sequence[Path]) -> list[tuple[str, str]]:
    # The algorithm is read from the resolved config the latest attempt saved beside its metrics.
    config_file = files[-1].parent / "config.yaml" if files else None
    if config_file is None or not config_file.is_file():
        return []
    return list(algorithm_metrics(algorithm_class_path(load_yaml(config_file.read_text()) or {})).items())


def columns(spec: StudySpec, records: Sequence[RunRecord]) -> list[Column]:
    """The runs' validation metrics (``<metric> (final)``, ``<monitor> (best)``), rounds to target,
    bytes and wall-clock, then the study's and the algorithms' extra metrics."""
    target = "" if spec.target_accuracy is None else f"{spec.target_accuracy:g}"
    scores = dict.fromkeys(key for record in records for key in record.scores)
    base = [
        *(Column(key, _label(key), "score") for key in scores),
        *([Column("rounds_to_target", f"rounds to {target}", "rounds")] if target else []),
        Column("total_upload_bytes", "uploaded", "bytes"),
        Column("total_download_bytes", "downloaded", "bytes"),
        Column("wall_clock_s", "wall-clock", "seconds"),
    ]
    known = {c.key for c in base} | {"rounds", "rounds_to_target"}
    extra: list[Column] = []
    for record in records:
        for key in record.summary:
            if key not in known:
                known.add(key)
                extra.append(Column(key, _label(key), "number"))
    return base + extra


def _label(key: str) -> str:
    reduction, _, metric = key.partition("/")
    return f"{metric} ({reduction})"


def arm_rows(spec: StudySpec, records: Sequence[RunRecord], cols: Sequence[Column]) -> list[dict[str, object]]:
    """One row per arm: counts, then ``<key>_mean`` / ``<key>_std`` over its finished runs, and its errors."""
    rows = []
    for arm in spec.arms:
        mine = [r for r in records if r.arm == arm.name]
        done = [r for r in mine if r.status == DONE]
        row: dict[str, object] = {
            "arm": arm.name,
            "runs": len(mine),
            "done": len(done),
            "failed": sum(r.status == FAILED for r in mine),
        }
        for col in cols:
            mean, std, n = mean_std(r.summary.get(col.key) for r in done)
            row[f"{col.key}_mean"], row[f"{col.key}_std"] = mean, std
            if col.key == "rounds_to_target":
                row["rounds_to_target_reached"] = n
        row["errors"] = "; ".join(f"seed {r.seed}: {r.error}" for r in mine if r.status != DONE and r.error)
        rows.append(row)
    return rows


def write_tables(spec: StudySpec, study_dir: Path, records: Sequence[RunRecord]) -> tuple[list[Column], list[dict[str, object]]]:
    """Writes ``summary.md``, ``summary.csv`` (one row per arm) and ``runs.csv`` (one row per run)."""
    cols = columns(spec, records)
    rows = arm_rows(spec, records, cols)
    _write_csv(study_dir / "summary.csv", rows)
    _write_csv(
        study_dir / "runs.csv",
        [
            {
                "arm": r.arm,
                "seed": r.seed,
                "status": r.status,
                "attempts": r.attempts,
                **{c.key: r.summary.get(c.key) for c in cols},
                "error": r.error or "",
            }
            for r in records
        ],
    )
    (study_dir / "summary.md").write_text(markdown(spec, cols, rows, records))
    return cols, rows


def display(cols: Sequence[Column], rows: Sequence[dict[str, object]]) -> tuple[list[str], list[list[str]]]:
    """The summary table's header and formatted cells (``mean ± std``, bytes in binary units)."""
    header = ["arm", "runs", *(c.label for c in cols)]
    cells = []
    for row in rows:
        runs = f"{row['done']}/{row['runs']}" + (f" ({row['failed']} failed)" if row["failed"] else "")
        line = [str(row["arm"]), runs]
        for col in cols:
            cell = _format(col.kind, row[f"{col.key}_mean"], row[f"{col.key}_std"])  # type: ignore[arg-type]
            if col.key == "rounds_to_target" and row["done"] and row["rounds_to_target_reached"] != row["done"]:
                cell += f" ({row['rounds_to_target_reached']}/{row['done']} reached)"
            line.append(cell)
        cells.append(line)
    return header, cells


def markdown(spec: StudySpec, cols: Sequence[Column], rows: Sequence[dict[str, object]], records: Sequence[RunRecord]) -> str:
    """The summary table as Markdown, with the unfinished runs and their errors below it."""
    header, cells = display(cols, rows)
    lines = [
        f"# Study `{spec.name}`",
        "",
        (
            f"Mean ± sample standard deviation over the finished runs of seeds {', '.join(map(str, spec.seeds))}. "
            "Metrics are the module's own, logged in validation (the global model on the server's validation "
            "split, never the test set): final = after the last round, best = the monitored metric's best round. "
            "Bytes are totals over all clients."
        ),
        "",
        "| " + " | ".join(header) + " |",
        "|" + "|".join(["---", "---"] + ["---:"] * len(cols)) + "|",
        *("| " + " | ".join(line) + " |" for line in cells),
    ]
    unfinished = [r for r in records if r.status != DONE]
    if unfinished:
        lines += ["", "## Runs not finished", ""]
        lines += [f"- `{r.arm}` seed {r.seed} ({r.status}): {r.error or 'not run yet'}" for r in unfinished]
    return "\n".join(lines) + "\n"


def _format(kind: str, mean: float, std: float) -> str:
    if math.isnan(mean):
        return "—"
    if kind == "bytes":
        scale, unit = byte_unit(mean)
        value, spread = f"{mean / scale:.2f}", f"{std / scale:.2f}"
        return f"{value} ± {spread} {unit}" if not math.isnan(std) else f"{value} {unit}"
    digits = {"score": 4, "rounds": 1, "seconds": 1}.get(kind, 4)
    value = f"{mean:.{digits}f}"
    text = value if math.isnan(std) else f"{value} ± {std:.{digits}f}"
    return text + (" s" if kind == "seconds" else "")


def _write_csv(path: Path, rows: Sequence[dict[str, object]]) -> None:
    fieldnames = list(dict.fromkeys(k for row in rows for k in row))
    with open(path, "w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=fieldnames)
        writer.writeheader()
        writer.writerows({k: ("" if isinstance(v, float) and math.isnan(v) else v) for k, v in row.items()} for row in rows)
