"""Runs every (arm, seed) of a study as its own ``fl-lightning fit`` process, resumably.

Each run lives in ``<study>/runs/<arm>/seed_<seed>/``::

    run.json            status, attempts (wall-clock, exit code, resumed from), error, W&B id
    completed.json      written by the run itself when its fit ends normally
    overrides.yaml      the study's and the arm's overrides
    run.yaml            what the study sets: seed, loggers, checkpointing
    output.log          the process's output, every attempt
    csv/version_<n>/    metrics.csv, hparams.yaml and the resolved config.yaml of attempt n
    checkpoints/        round_<r>.ckpt of the latest round, and last.ckpt linking to it
    wandb/              when W&B is on

A run is ``done`` when its process exits 0 *and* wrote ``completed.json``; a done run is
skipped when the study runs again, and any other starts again, from ``checkpoints/last.ckpt``
when there is one (written after every round).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from fl_lightning.study.spec import Arm, StudySpec, dump_yaml, expand_dotted, load_yaml, merge

PENDING, RUNNING, DONE, FAILED, INTERRUPTED = "pending", "running", "done", "failed", "interrupted"


@dataclass(frozen=True)
class Run:
    """One (arm, seed) of a study, and where its files go."""

    arm: Arm
    seed: int
    directory: Path

    @property
    def name(self) -> str:
        return f"{self.arm.name}/seed_{self.seed}"

    @property
    def state_file(self) -> Path:
        return self.directory / "run.json"

    @property
    def log_file(self) -> Path:
        return self.directory / "output.log"

    @property
    def csv_dir(self) -> Path:
        return self.directory / "csv"

    @property
    def marker(self) -> Path:
        """Written by the run's :class:`~fl_lightning.study.callback.CompletionMarker` when its fit ends."""
        return self.directory / "completed.json"

    @property
    def last_checkpoint(self) -> Path:
        return self.directory / "checkpoints" / "last.ckpt"


@dataclass
class RunState:
    """What ``run.json`` records about a run across its attempts."""

    arm: str
    seed: int
    status: str = PENDING
    fingerprint: str = ""
    wandb_id: str = field(default_factory=lambda: secrets.token_hex(4))
    error: str | None = None
    command: str = ""
    attempts: list[dict[str, Any]] = field(default_factory=list)

    @property
    def wall_clock_s(self) -> float:
        """Seconds spent in the run's processes, over all attempts."""
        return sum(a.get("wall_clock_s", 0.0) for a in self.attempts)

    @classmethod
    def load(cls, run: Run) -> RunState:
        if run.state_file.is_file():
            try:
                return cls(**json.loads(run.state_file.read_text()))
            except (json.JSONDecodeError, TypeError):
                pass  # a state file cut short by a crash: the run counts as not finished
        return cls(arm=run.arm.name, seed=run.seed)

    def save(self, run: Run) -> None:
        run.directory.mkdir(parents=True, exist_ok=True)
        tmp = run.state_file.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2))
        os.replace(tmp, run.state_file)  # atomic: a killed study never leaves half a run.json


def plan(spec: StudySpec) -> list[Run]:
    """Every (arm, seed), arm-major, in the study's order."""
    root = spec.study_dir.resolve() / "runs"
    return [Run(arm, seed, root / arm.name / f"seed_{seed}") for arm in spec.arms for seed in spec.seeds]


def run_config(spec: StudySpec, run: Run, state: RunState, overrides: dict[str, Any]) -> dict[str, Any]:
    """The config layer the study puts last: the seed, the run's loggers and its checkpointing."""
    config: dict[str, Any] = {}
    for key in spec.seed_keys:
        config = merge(config, expand_dotted({key: run.seed}))
    loggers: list[dict[str, Any]] = [
        {
            "class_path": "lightning.pytorch.loggers.CSVLogger",
            "init_args": {"save_dir": str(run.directory), "name": "csv", "flush_logs_every_n_steps": 1},
        }
    ]
    callbacks = configured_callbacks([*spec.base, *run.arm.configs], overrides)
    callbacks.append(
        {
            "class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
            # The latest round's checkpoint, linked as last.ckpt: one file written per round.
            "init_args": {
                "dirpath": str(run.last_checkpoint.parent),
                "filename": "round_{epoch}",
                "auto_insert_metric_name": False,
                "save_top_k": 1,
                "save_last": "link",
                "every_n_epochs": 1,
                "enable_version_counter": False,
            },
        }
    )
    callbacks.append({"class_path": "fl_lightning.study.callback.CompletionMarker", "init_args": {"path": str(run.marker)}})
    if spec.wandb is not None:
        from fl_lightning.study.tracking import wandb_logger_config

        loggers.append(wandb_logger_config(spec, run.arm.name, run.seed, state.wandb_id, run.directory))
        callbacks.append(
            {
                "class_path": "fl_lightning.study.callback.WandbRunSummary",
                "init_args": {
                    "monitor": spec.monitor,
                    "mode": spec.mode,
                    "target_accuracy": spec.target_accuracy,
                    "metrics": dict(spec.metrics),
                },
            }
        )
    trainer = {
        "default_root_dir": str(run.directory),
        "enable_progress_bar": False,
        "enable_checkpointing": True,
        "logger": loggers,
        "callbacks": callbacks,
    }
    return merge(config, {"trainer": trainer})


def configured_callbacks(config_files: Sequence[Path], overrides: dict[str, Any]) -> list[Any]:
    """The ``trainer.callbacks`` the run's configs set: the study appends its own to these.

    A later config's list replaces an earlier one, as in ``fl-lightning fit --config a --config b``.
    """
    callbacks: list[Any] = []
    for source in [load_yaml(path.read_text()) for path in config_files] + [overrides]:
        trainer = source.get("trainer") if isinstance(source, dict) else None
        if isinstance(trainer, dict) and "callbacks" in trainer:
            value = trainer["callbacks"]
            callbacks = [] if value is None else list(value) if isinstance(value, list) else [value]
    return callbacks


def command(spec: StudySpec, run: Run, *, resume_from: Path | None) -> list[str]:
    """``fl-lightning fit`` for the run: base configs, the arm's configs, overrides, the run layer."""
    args = [sys.executable, "-m", "fl_lightning.cli", "fit"]
    for path in [*spec.base, *run.arm.configs, run.directory / "overrides.yaml", run.directory / "run.yaml"]:
        args += ["--config", str(path)]
    if resume_from is not None:
        args += ["--ckpt_path", str(resume_from)]
    return args


def prepare(spec: StudySpec, run: Run) -> tuple[RunState, list[str]]:
    """Writes the run's config layers; returns its state and its command (resuming if it has a checkpoint)."""
    state = RunState.load(run)
    overrides = merge(spec.overrides, run.arm.overrides)
    run.directory.mkdir(parents=True, exist_ok=True)
    (run.directory / "overrides.yaml").write_text(dump_yaml(overrides))
    (run.directory / "run.yaml").write_text(dump_yaml(run_config(spec, run, state, overrides)))
    args = command(spec, run, resume_from=run.last_checkpoint if run.last_checkpoint.is_file() else None)
    state.command = shlex.join(["fl-lightning", *args[3:]])
    state.fingerprint = spec.fingerprint(run.arm, run.seed)
    return state, args


def begin_attempt(run: Run, state: RunState, args: Sequence[str]) -> dict[str, Any]:
    """Records a new attempt of ``run`` (status ``running``) and returns it, to be completed."""
    resume = args.index("--ckpt_path") + 1 if "--ckpt_path" in args else None
    attempt: dict[str, Any] = {
        "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "resumed_from": None if resume is None else args[resume],
    }
    state.status = RUNNING
    state.attempts.append(attempt)
    state.save(run)
    return attempt


def record_failure(run: Run, state: RunState, args: Sequence[str], error: str) -> RunState:
    """Records an attempt that failed before its process started (e.g. its config does not parse)."""
    attempt = begin_attempt(run, state, args)
    attempt.update(wall_clock_s=0.0, returncode=None, error=error)
    state.status, state.error = FAILED, error
    state.save(run)
    return state


class Launcher:
    """Starts runs as processes, at most ``workers`` at a time, and stops them on request."""

    def __init__(self, spec: StudySpec, *, workers: int | None = None) -> None:
        self.spec = spec
        self.workers = workers if workers is not None else spec.workers
        self._live: set[subprocess.Popen[bytes]] = set()
        self._lock = threading.Lock()
        self._stopping = threading.Event()

    @property
    def running(self) -> int:
        """Runs in flight now."""
        with self._lock:
            return len(self._live)

    def environment(self) -> dict[str, str]:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        if self.spec.wandb is not None and self.spec.wandb.mode is not None:
            env.setdefault("WANDB_MODE", self.spec.wandb.mode)  # the environment's wins
        if self.workers > 1 and "OMP_NUM_THREADS" not in env:
            # Concurrent runs would otherwise each start one intra-op thread per core.
            env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // self.workers))
        return env

    def run_all(self, runs: Sequence[Run], on_done: Callable[[Run, RunState], None]) -> None:
        """Runs ``runs`` and calls ``on_done`` after each; Ctrl-C stops them all (they resume next time)."""
        with ThreadPoolExecutor(max_workers=self.workers) as pool:
            futures = {pool.submit(self.execute, run): run for run in runs}
            try:
                for future in as_completed(futures):
                    on_done(futures[future], future.result())
            except KeyboardInterrupt:
                self.stop()
                pool.shutdown(wait=True, cancel_futures=True)
                raise

    def stop(self) -> None:
        self._stopping.set()
        with self._lock:
            live = list(self._live)
        for process in live:
            # Lightning stops gracefully on SIGTERM; SIGINT may be ignored (a study started in the background).
            process.send_signal(signal.SIGTERM)
        for process in live:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()

    def execute(self, run: Run) -> RunState:
        """One attempt at ``run``: from its last checkpoint if it has one."""
        if self._stopping.is_set():
            return RunState.load(run)
        state, args = prepare(self.spec, run)
        attempt = begin_attempt(run, state, args)
        run.marker.unlink(missing_ok=True)
        started = time.perf_counter()
        with open(run.log_file, "ab") as log:
            log.write(f"\n=== attempt {len(state.attempts)} ({attempt['started']}): {state.command}\n".encode())
            log.flush()
            offset = log.tell()
            process = subprocess.Popen(
                args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=self.environment()
            )
            with self._lock:
                self._live.add(process)
            returncode = process.wait()
            with self._lock:
                self._live.discard(process)
        attempt.update(wall_clock_s=round(time.perf_counter() - started, 3), returncode=returncode)
        if returncode == 0 and run.marker.is_file():
            state.status, state.error = DONE, None
        elif self._stopping.is_set():
            state.status, state.error = INTERRUPTED, "interrupted"
        elif returncode == 0:
            state.status, state.error = INTERRUPTED, "stopped before the end of fit (e.g. on SIGTERM)"
        else:
            with open(run.log_file, "rb") as log:
                log.seek(offset)
                output = log.read().decode(errors="replace")
            state.status, state.error = FAILED, error_message(output, returncode)
        attempt["error"] = state.error
        state.save(run)
        return state


_ERROR_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*(?:Error|Exception|Interrupt)\b|error:)")
# jsonargparse's union diagnostics: the type list, the given value and the `None` alternative.
_NOISE = re.compile(r"^\s*(?:Subtypes:|Given value|- Expected a <class 'NoneType'>)")


def error_message(output: str, returncode: int, limit: int = 400) -> str:
    """The error a failed run printed: the last exception line (or ``error:`` line) and its continuation.

    Example:
        >>> error_message("Traceback ...\\n  raise ...\\nValueError: `mu` must be >= 0\\n", 1)
        'ValueError: `mu` must be >= 0'
    """
    lines = [line.rstrip() for line in output.splitlines()]
    for index in range(len(lines) - 1, -1, -1):
        if _ERROR_LINE.match(lines[index]):
            message = " ".join(line.strip() for line in lines[index:] if line.strip() and not _NOISE.match(line))
            return message if len(message) <= limit else message[: limit - 1] + "…"
    tail = next((line.strip() for line in reversed(lines) if line.strip()), "")
    reason = f"killed by signal {-returncode}" if returncode < 0 else f"exit code {returncode}"
    return f"{reason}: {tail}"[:limit] if tail else reason
