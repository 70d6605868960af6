"""Runs every (arm, seed) of a study as its own ``fl-lightning fit`` process, resumably.

Each run lives in ``<study>/runs/<arm>/seed_<seed>/``::

    run.json            status, attempts (wall-clock, exit code, resumed from), error, W&B id
    run.lock            locked while a study runs the run (see fl_lightning.study.lock)
    completed.json      written by the run itself when its fit ends normally
    overrides.yaml      the study's and the arm's overrides
    run.yaml            what the study sets: seed, loggers, checkpointing
    output.log          the process's output, every attempt
    csv/version_<n>/    metrics.csv, hparams.yaml and the resolved config.yaml of attempt n
    checkpoints/        round_<r>.ckpt of the latest round, and last.ckpt linking to it
    wandb/              when W&B is on

A run is ``done`` when its process exits 0 *and* wrote ``completed.json``; a done run is
skipped when the study runs again, and any other starts again, from ``checkpoints/last.ckpt``
when there is one (written after every round). A run is locked while a study runs it: another
study refuses it, and the run's process dies with its study (on Linux).
"""

from __future__ import annotations

import contextlib
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
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, BinaryIO

from fl_lightning.checkpointing import newest_intact_checkpoint
from fl_lightning.study.children import die_with_parent
from fl_lightning.study.lock import RunLock, RunLocked
from fl_lightning.study.spec import Arm, StudySpec, dump_yaml, expand_dotted, load_yaml, merge

PENDING, RUNNING, DONE, FAILED, INTERRUPTED = "pending", "running", "done", "failed", "interrupted"
#: How often the study's main thread wakes while its runs train, to run a pending signal's handler.
SIGNAL_POLL_SECONDS = 0.5


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
    def lock_file(self) -> Path:
        return self.directory / "run.lock"

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
            with contextlib.suppress(json.JSONDecodeError, TypeError):  # cut short by a crash: the run is not finished
                return cls(**json.loads(run.state_file.read_text()))
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
    # last.ckpt, or the newest intact round_<r>.ckpt when a crash left last.ckpt dangling or cut short.
    resume_from = newest_intact_checkpoint(run.last_checkpoint.parent)
    args = command(spec, run, resume_from=None if resume_from is None else Path(resume_from))
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
    """Starts runs as processes, at most ``workers`` at a time, and stops them on request.

    A run is claimed (its folder locked) before it starts and released when its attempt ends;
    its process inherits the lock and gets SIGTERM if this process dies.
    """

    def __init__(self, spec: StudySpec, *, workers: int | None = None) -> None:
        self.spec = spec
        self.workers = workers if workers is not None else spec.workers
        self._live: set[subprocess.Popen[bytes]] = set()
        self._claims: dict[Path, RunLock] = {}
        self._lock = threading.Lock()
        self._stopping = threading.Event()

    @property
    def running(self) -> int:
        """Runs in flight now."""
        with self._lock:
            return len(self._live)

    def claim(self, run: Run) -> RunLock:
        """Locks ``run``'s folder for this launcher (a no-op if it already has), until its attempt ends.

        Raises:
            RunLocked: Another process holds the run, naming it.
        """
        with self._lock:
            lock = self._claims.get(run.directory)
            if lock is None:
                lock = RunLock(run.lock_file, run.name)
                lock.acquire()
                self._claims[run.directory] = lock
            return lock

    def release(self, run: Run) -> None:
        """Drops the claim on ``run``, if this launcher holds it."""
        with self._lock:
            lock = self._claims.pop(run.directory, None)
        if lock is not None:
            lock.release()

    def release_all(self) -> None:
        """Drops every claim, e.g. of runs an interruption left unstarted."""
        with self._lock:
            locks, self._claims = list(self._claims.values()), {}
        for lock in locks:
            lock.release()

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
            try:
                futures = {pool.submit(self.execute, run): run for run in runs}
                order = {future: i for i, future in enumerate(futures)}  # report in submission order
                pending = set(futures)
                while pending:
                    # Timed: a Ctrl-C or SIGTERM the kernel hands to another thread (a run's waiter, W&B's) runs its
                    # handler only once the main thread wakes; an untimed wait would sleep until a run ends.
                    done, pending = wait(pending, timeout=SIGNAL_POLL_SECONDS, return_when=FIRST_COMPLETED)
                    for future in sorted(done, key=order.__getitem__):
                        on_done(futures[future], future.result())
            except KeyboardInterrupt:
                self.stop()
                pool.shutdown(wait=True, cancel_futures=True)
                raise

    def stop(self) -> None:
        """Stops the runs in flight (SIGTERM, then SIGKILL after 30 s) and starts no more."""
        with self._lock:
            self._stopping.set()  # under the lock: no run starts after the snapshot below
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
        """One attempt at ``run``, from its last checkpoint if it has one, unless another process holds it.

        Returns:
            The run's state after the attempt; for a run held by another process, its state as
            that process last saved it, with the refusal as its (unsaved) error.
        """
        if self._stopping.is_set():
            return RunState.load(run)
        try:
            lock = self.claim(run)
        except RunLocked as refusal:
            return replace(RunState.load(run), error=str(refusal))
        try:
            state = RunState.load(run)
            if state.status == DONE:  # finished by another study since this one looked
                return state
            return self._attempt(run, lock)
        finally:
            self.release(run)

    def _attempt(self, run: Run, lock: RunLock) -> RunState:
        state, args = prepare(self.spec, run)
        attempt = begin_attempt(run, state, args)
        run.marker.unlink(missing_ok=True)
        started = time.perf_counter()
        with open(run.log_file, "ab") as log:
            log.write(f"\n=== attempt {len(state.attempts)} ({attempt['started']}): {state.command}\n".encode())
            log.flush()
            offset = log.tell()
            with self._lock:
                process = None if self._stopping.is_set() else self._start(args, log, lock)
            returncode = None
            if process is not None:
                returncode = process.wait()
                with self._lock:
                    self._live.discard(process)
        attempt.update(wall_clock_s=round(time.perf_counter() - started, 3), returncode=returncode)
        if returncode == 0 and run.marker.is_file():
            state.status, state.error = DONE, None
        elif returncode is None or self._stopping.is_set():
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

    def _start(self, args: Sequence[str], log: BinaryIO, lock: RunLock) -> subprocess.Popen[bytes]:
        """Starts the run's process (called under ``self._lock``): it inherits the run's lock and dies with us."""
        process = subprocess.Popen(
            args,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=self.environment(),
            pass_fds=(lock.fd,),  # the run stays locked while its process lives, even if this one dies
            preexec_fn=die_with_parent(),  # it only calls prctl, so it is safe beside our threads
        )
        self._live.add(process)
        lock.record_child(process.pid)
        return process


_TRACEBACK = "Traceback (most recent call last):"
# A traceback Python prints without the process failing: in a destructor, or an atexit hook.
_IGNORED = ("Exception ignored in", "Error in atexit._run_exitfuncs")
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<function>.+)$')
# An exception printed without a traceback, or jsonargparse's parser error.
_ERROR_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*(?:Error|Exception|Interrupt)\b|error:)")
# jsonargparse's union diagnostics: the type list, the given value and the `None` alternative.
_NOISE = re.compile(r"^\s*(?:Subtypes:|Given value|- Expected a <class 'NoneType'>)")


def error_message(output: str, returncode: int, limit: int = 400) -> str:
    """The error a failed run printed: its last traceback's exception and where it was raised.

    Without a traceback, the last exception or parser (``error:``) line. For a process killed by a
    signal, or one that printed no error, the signal or exit code, and the output's last line
    labelled as such.

    Example:
        >>> error_message("Traceback (most recent call last):\\n  File x\\nValueError: `mu` must be >= 0\\n", 1)
        'ValueError: `mu` must be >= 0'
    """
    lines = [line.rstrip() for line in output.splitlines()]
    if returncode < 0:
        message, reason = None, f"killed by signal {-returncode} ({_signal_name(-returncode)})"
    else:
        message, reason = _last_exception(lines), f"exit code {returncode}"
        if message is None:
            start = next((i for i in range(len(lines) - 1, -1, -1) if _ERROR_LINE.match(lines[i])), None)
            message = None if start is None else _paragraph(lines, start)
    if message is None:
        tail = next((line.strip() for line in reversed(lines) if line.strip()), "")
        message = f"{reason}; last output: {tail}" if tail else reason
    return message if len(message) <= limit else message[: limit - 1] + "…"


def _last_exception(lines: Sequence[str]) -> str | None:
    """The exception of the last traceback that ended the process, with its innermost frame."""
    headers = [i for i, line in enumerate(lines) if line == _TRACEBACK]
    for header in reversed(headers):
        before = next((line for line in reversed(lines[:header]) if line.strip()), "")
        if before.startswith(_IGNORED):
            continue
        # The exception line is the first line after the header that is not a frame (frames are indented).
        start = next((i for i in range(header + 1, len(lines)) if lines[i] and not lines[i][:1].isspace()), None)
        if start is None:
            return None
        frames = [match for match in map(_FRAME.match, lines[header + 1 : start]) if match]
        where = f" [{_short(frames[-1]['file'])}:{frames[-1]['line']} in {frames[-1]['function']}]" if frames else ""
        return _paragraph(lines, start) + where
    return None


def _paragraph(lines: Sequence[str], start: int) -> str:
    """Line ``start`` and the indented lines right after it (a message's details), without jsonargparse's noise.

    An unindented line after it is other output (an ``atexit`` hook's, a logger's), not the message.
    """
    end = next((i for i in range(start + 1, len(lines)) if not lines[i][:1].isspace() or not lines[i].strip()), len(lines))
    return " ".join(line.strip() for line in lines[start:end] if not _NOISE.match(line))


def _short(path: str) -> str:
    """``path``'s last two parts: enough to find the file, short enough for a table."""
    return "/".join(Path(path).parts[-2:])


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return "unknown signal"
