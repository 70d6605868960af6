"""``run_study``: run what is missing, then write the tables, the plots and the W&B summary run.

Example::

    for arm, seed in arms x seeds:
        if run.json says done: skip                    # (warn if its config changed since)
        lock the run's folder, or refuse the run       # another study is running it
    parse each remaining arm's configs once            # an arm that does not parse fails now
    for each remaining run:                            # `workers` processes at a time
        fl-lightning fit --config base... --config arm... --config overrides.yaml --config run.yaml
                         [--ckpt_path checkpoints/last.ckpt]      # resume an interrupted run
        run.json <- done | failed (error) | interrupted
    summary.md, summary.csv, runs.csv <- every run's CSV logs
    plots/*.png                                         # if plots
    W&B summary run <- wandb.Table + plots              # if wandb
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.measure import Measurement
from rich.table import Table

from fl_lightning.study.config_check import config_error
from fl_lightning.study.report import RunRecord, collect, display, write_tables
from fl_lightning.study.lock import RunLocked, describe
from fl_lightning.study.runner import DONE, FAILED, Launcher, Run, RunState, plan, prepare, record_failure
from fl_lightning.study.spec import StudySpec, dump_yaml


@dataclass
class StudyResult:
    """What a study produced: its runs' records and the files it wrote."""

    directory: Path
    records: list[RunRecord]
    attempted: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    refused: dict[str, str] = field(default_factory=dict)
    plots: dict[str, Path] = field(default_factory=dict)

    @property
    def failed(self) -> list[RunRecord]:
        """The runs whose last attempt failed."""
        return [record for record in self.records if record.status == FAILED]

    @property
    def ok(self) -> bool:
        """No run failed, and none was refused because another process holds it."""
        return not self.failed and not self.refused

    @property
    def summary_markdown(self) -> Path:
        return self.directory / "summary.md"

    @property
    def summary_csv(self) -> Path:
        return self.directory / "summary.csv"


def run_study(spec: StudySpec, *, report_only: bool = False, console: Console | None = None) -> StudyResult:
    """Runs the study's missing runs (none if ``report_only``), then reports on all of them.

    A run that fails is recorded with its error and reported; it never stops the others. A run
    that another process (another study) is running is refused, and listed in ``refused``.
    """
    # Rich's width: the terminal's, else COLUMNS, else 80; summary_table fits the table to it.
    console = console or Console()
    if spec.plots:
        from fl_lightning.study.plots import require_matplotlib

        require_matplotlib()  # before hours of runs, not after
    study_dir = spec.study_dir
    study_dir.mkdir(parents=True, exist_ok=True)
    (study_dir / "study.yaml").write_text(dump_yaml(spec.to_dict()))
    runs = plan(spec)
    result = StudyResult(directory=study_dir, records=[])

    launcher = Launcher(spec)
    try:
        todo = _pending(spec, runs, None if report_only else launcher, result, console)
        if result.skipped:
            console.print(f"{spec.name}: {len(result.skipped)} of {len(runs)} runs already done, skipped.")
        if todo and not report_only:
            _execute(spec, launcher, _check_configs(spec, todo, result, console), result, console)
    finally:
        launcher.release_all()  # runs an interruption left unstarted

    result.records = collect(spec, runs)
    cols, rows = write_tables(spec, study_dir, result.records)
    histories: dict[str, list] = defaultdict(list)
    for record in result.records:
        if record.status == DONE:
            histories[record.arm].append(record.history)
    if spec.plots:
        from fl_lightning.study.plots import write_plots

        ordered = {arm.name: histories[arm.name] for arm in spec.arms if histories[arm.name]}
        # The validation metrics of the finished runs, the monitored one first (its "final/" key comes first).
        metrics = list(dict.fromkeys(k.partition("/")[2] for r in result.records if r.status == DONE for k in r.scores))
        result.plots = write_plots(study_dir / "plots", ordered, metrics=metrics, study=spec.name, target=spec.target_accuracy)
    if spec.wandb is not None:
        from fl_lightning.study.tracking import log_summary_run

        names = list(rows[0]) if rows else []
        try:
            log_summary_run(spec, study_dir, names, [[row[k] for k in names] for row in rows], result.plots)
        except Exception as error:  # noqa: BLE001 - the tables and plots are on disk; W&B is a copy
            console.print(f"[yellow]Could not log the summary run to W&B: {escape(repr(error))}[/yellow]")
    console.print(summary_table(spec, *display(cols, rows), console=console))
    for run, record in zip(runs, result.records, strict=True):
        if record.status != DONE:
            error = result.refused.get(run.name) or record.error or "not run yet"
            log = f" (log: {run.log_file})" if record.status == FAILED else ""
            console.print(f"[red]{record.arm} seed {record.seed} {record.status}[/red]: {escape(error)}{log}")
    console.print(
        f"Tables: {result.summary_markdown}, {result.summary_csv}" + (f"; plots: {study_dir / 'plots'}" if result.plots else "")
    )
    return result


def _pending(spec: StudySpec, runs: list[Run], launcher: Launcher | None, result: StudyResult, console: Console) -> list[Run]:
    """The runs not done yet, each claimed by ``launcher`` (if given); fills ``result.skipped`` and ``refused``."""
    todo = []
    for run in runs:
        if launcher is not None and RunState.load(run).status != DONE:
            try:
                lock = launcher.claim(run)
            except RunLocked as refusal:
                result.refused[run.name] = str(refusal)
                console.print(f"[red]{escape(str(refusal))}[/red]")
                continue
            if lock.taken_over:
                console.print(f"[yellow]{run.name}: took over the lock left by {describe(lock.taken_over)}.[/yellow]")
        state = RunState.load(run)  # read after the claim: another study may have just finished the run
        if state.status != DONE:
            todo.append(run)
            continue
        if launcher is not None:
            launcher.release(run)
        result.skipped.append(run.name)
        if state.fingerprint and state.fingerprint != spec.fingerprint(run.arm, run.seed):
            console.print(
                f"[yellow]{run.name} finished with a different config than the study's now; "
                f"delete {run.directory} to run it again.[/yellow]"
            )
    return todo


def _check_configs(spec: StudySpec, todo: list[Run], result: StudyResult, console: Console) -> list[Run]:
    """Parses each arm's configs once, here; an arm's runs fail now, unlaunched, if its configs do not parse."""
    errors: dict[str, str | None] = {}
    launch = []
    for run in todo:
        state, args = prepare(spec, run)
        if run.arm.name not in errors:
            errors[run.arm.name] = config_error(args[3:])
        error = errors[run.arm.name]
        if error is None:
            launch.append(run)
            continue
        record_failure(run, state, args, error)
        result.attempted.append(run.name)
        console.print(f"{run.name}: [red]failed[/red] (config): {escape(error)}")
    return launch


def _execute(spec: StudySpec, launcher: Launcher, todo: list[Run], result: StudyResult, console: Console) -> None:
    if not todo:
        return
    console.print(f"{spec.name}: running {len(todo)} run(s), {launcher.workers} at a time; logs in {spec.study_dir / 'runs'}.")
    finished = 0

    def on_done(run: Run, state: RunState) -> None:
        nonlocal finished
        finished += 1
        result.attempted.append(run.name)
        seconds = state.attempts[-1].get("wall_clock_s", 0.0) if state.attempts else 0.0
        detail = f"[red]{state.status}[/red]: {escape(state.error or '')}" if state.status != DONE else "[green]done[/green]"
        console.print(rf"\[{finished}/{len(todo)}] {run.name}: {detail} ({seconds:.1f} s)")

    try:
        launcher.run_all(todo, on_done)
    except KeyboardInterrupt:
        console.print(f"[yellow]Interrupted: run the same command again to finish {spec.name}.[/yellow]")
        raise


def summary_table(spec: StudySpec, header: list[str], cells: list[list[str]], *, console: Console) -> Table:
    """One row per arm when that fits the console's width; else one column per arm (a study has
    fewer arms than summary columns), so 80 columns show every value whole."""
    title = f"Study {spec.name}: mean ± std over seeds {', '.join(map(str, spec.seeds))}"
    wide = Table(title=title)
    for index, name in enumerate(header):
        wide.add_column(name, justify="left" if index < 2 else "right")
    for line in cells:
        wide.add_row(*line)
    # The width the table would take unconstrained, every cell on one line.
    if Measurement.get(console, console.options.update_width(10**6), wide).maximum <= console.width:
        return wide
    tall = Table(title=title)
    tall.add_column(header[0])
    for line in cells:
        tall.add_column(line[0], justify="right")
    for index, name in enumerate(header[1:], start=1):
        tall.add_row(name, *(line[index] for line in cells))
    return tall
