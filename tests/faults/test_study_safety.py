"""Fault injection on studies: run locks, stale locks, a killed study, failed runs' exit status and errors.

The runs here are small ``python -c`` scripts standing in for ``fl-lightning fit`` (as in
``tests/study/test_runner.py``), so each test takes about a second, or a few when a study runs
in its own process to be killed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml

from fl_lightning.study import compare, runner
from fl_lightning.study.cli import main
from fl_lightning.study.lock import RunLock, RunLocked
from fl_lightning.study.runner import error_message, plan
from fl_lightning.study.spec import load_study

from ..study.conftest import REPO
from ..waiting import CEILING, wait_for

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="dying with the parent uses Linux's prctl")

FINISH = "open(r'{marker}', 'w').write('{{}}')"
# A real traceback, then output that is not the error: an atexit hook's line, a destructor's traceback.
CRASH = (
    "import atexit; print('round 2: val_acc=0.5'); atexit.register(print, 'wandb: Synced 3 W&B file(s)'); "
    "raise RuntimeError('simulated out of memory')"
)
# Run by a child process: loads the study modules without the packages' __init__ (which import
# torch and lightning: seconds per process on a busy machine), then runs the script at argv[2].
LOAD = """
import sys, types
from pathlib import Path
for name in ("fl_lightning", "fl_lightning.study"):
    package = types.ModuleType(name)
    package.__path__ = [str(Path(sys.argv[1], *name.split(".")))]
    sys.modules[name] = package
"""
# Holds the run's lock until killed.
HOLDER = LOAD + """
import time
from fl_lightning.study.lock import RunLock
RunLock(Path(sys.argv[2]), "x").acquire()
print("held", flush=True)
time.sleep(600)
"""
# A study (its Launcher) whose one run writes its PID to argv[3], then sleeps.
STUDY = LOAD + """
from fl_lightning.study import runner
from fl_lightning.study.spec import load_study
script = f"import os, pathlib, time; pathlib.Path(r'{sys.argv[3]}').write_text(str(os.getpid())); time.sleep(600)"
runner.command = lambda spec, run, *, resume_from: [sys.executable, "-c", script, "fit"]
spec = load_study(sys.argv[2])
runner.Launcher(spec).run_all(runner.plan(spec), lambda run, state: None)
"""
# Until stopped: the tests check it was stopped (its return code), not how fast.
SLEEP = "import os, pathlib, time; pathlib.Path(r'{pid}').write_text(str(os.getpid())); time.sleep(600)"


def write_study(tmp_path: Path, arms: dict[str, str]) -> Path:
    """A study of one seed per arm, with plots off; ``arms`` maps each arm to its run's script."""
    (tmp_path / "base.yaml").write_text("{}")
    study = tmp_path / "study.yaml"
    fields = {"name": "s", "base": "base.yaml", "seeds": [0], "plots": False, "arms": {name: {} for name in arms}}
    study.write_text(yaml.safe_dump({**fields, "directory": str(tmp_path / "out")}))
    return study


@pytest.fixture
def fake_runs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """Makes each arm's run ``python -c <its script>`` (``{marker}``: its completion marker); returns the study file."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["fl-lightning-compare"])

    def make(arms: dict[str, str]) -> Path:
        command = lambda spec, run, *, resume_from: [  # noqa: E731
            sys.executable, "-c", arms[run.arm.name].format(marker=run.marker), "fit"
        ]
        monkeypatch.setattr(runner, "command", command)
        monkeypatch.setattr(compare, "config_error", lambda args: None)  # the scripts are not configs
        return write_study(tmp_path, arms)

    return make


def start(script: str, *args: str) -> subprocess.Popen[bytes]:
    """``python -c script REPO *args``."""
    return subprocess.Popen([sys.executable, "-c", script, str(REPO), *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def gone(pid: int) -> bool:
    """No such process, or a zombie (a dead orphan that init has not reaped yet)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def only_run(study: Path) -> runner.Run:
    (run,) = plan(load_study(study))
    return run


def test_a_run_another_process_holds_is_refused_naming_it_and_its_stale_lock_is_taken_over(fake_runs, capsys):
    study = fake_runs({"a": FINISH})
    run = only_run(study)
    holder = start(HOLDER, str(run.lock_file))
    try:
        assert holder.stdout.readline() == b"held\n", holder.stdout.read()
        with pytest.raises(SystemExit) as exited:
            main([str(study)])
        assert exited.value.code == 1
        out = capsys.readouterr().out
        assert f"run a/seed_0 is already running, locked by process {holder.pid} (on " in out
        assert not run.marker.exists() and not run.state_file.exists()  # nothing ran, nothing written
    finally:
        holder.kill()
        holder.wait()
    # The holder died holding the lock: its file still names it, and the next study takes it over.
    assert json.loads(run.lock_file.read_text())["pid"] == holder.pid
    main([str(study)])  # exits normally: status 0
    out = capsys.readouterr().out
    assert f"a/seed_0: took over the lock left by process {holder.pid} (on " in out and "; exited)" in out
    assert json.loads(run.state_file.read_text())["status"] == "done"
    assert run.lock_file.read_text() == ""  # released


def test_a_run_another_study_finished_meanwhile_is_not_run_again(fake_runs, monkeypatch):
    study = fake_runs({"a": "raise SystemExit('must not run')"})
    run = only_run(study)
    acquire = RunLock.acquire

    def finished_by_another_study(lock: RunLock) -> None:
        # The other study saves `done` and releases just before this one gets the lock.
        runner.RunState(arm="a", seed=0, status="done").save(run)
        acquire(lock)

    monkeypatch.setattr(RunLock, "acquire", finished_by_another_study)
    result = compare.run_study(load_study(study))
    assert (result.attempted, result.skipped, result.ok) == ([], ["a/seed_0"], True)
    assert not run.log_file.exists()


def test_a_study_with_a_failed_run_exits_1_showing_its_real_error(fake_runs, capsys):
    study = fake_runs({"good": FINISH, "bad": CRASH})
    with pytest.raises(SystemExit) as exited:
        main([str(study)])
    assert exited.value.code == 1
    error = "RuntimeError: simulated out of memory [<string>:1 in <module>]"
    bad = next(run for run in plan(load_study(study)) if run.arm.name == "bad")
    assert json.loads(bad.state_file.read_text())["error"] == error
    assert "wandb: Synced" in bad.log_file.read_text()  # in the log, after the traceback, but not the error
    out = " ".join(capsys.readouterr().out.split())  # rich wraps long lines
    assert f"bad seed 0 failed: {error} (log: {bad.log_file})" in out


@linux_only
def test_killing_a_study_with_sigkill_kills_its_run_and_frees_the_run(tmp_path):
    study, pid_file = write_study(tmp_path, {"a": ""}), tmp_path / "run.pid"
    run = only_run(study)
    parent = start(STUDY, str(study), str(pid_file))
    child = None
    try:
        wait_for(lambda: pid_file.exists() and pid_file.read_text().isdigit(), "the run to start")
        child = int(pid_file.read_text())
        with pytest.raises(RunLocked, match=rf"locked by process {parent.pid} \(on .*\) and its run, process {child}:"):
            RunLock(run.lock_file, run.name).acquire()
        parent.kill()
        parent.wait()
        wait_for(lambda: gone(child), f"the orphaned run {child} to die")
    finally:
        parent.kill()
        parent.wait()
        if child is not None and not gone(child):
            os.kill(child, signal.SIGKILL)  # leave no orphan behind when the test fails
    lock = RunLock(run.lock_file, run.name)
    lock.acquire()  # neither the study nor its run holds it any more
    assert lock.taken_over is not None and (lock.taken_over["pid"], lock.taken_over["child"]) == (parent.pid, child)
    lock.release()


def test_a_runs_process_keeps_its_run_locked_after_the_study_lets_go(fake_runs, tmp_path):
    # Where a killed study's run outlives it (no prctl), the run must still be refused to the next study.
    pid_file = tmp_path / "run.pid"
    study = fake_runs({"a": SLEEP.format(pid=pid_file)})
    run, launcher = only_run(study), runner.Launcher(load_study(study))
    thread = threading.Thread(target=launcher.run_all, args=([run], lambda run, state: None))
    thread.start()
    try:
        wait_for(lambda: pid_file.exists() and pid_file.read_text().isdigit(), "the run to start")
        launcher.release_all()  # as if the study were gone: only the run's process holds the lock now
        with pytest.raises(RunLocked, match=rf"and its run, process {int(pid_file.read_text())}:"):
            RunLock(run.lock_file, run.name).acquire()
    finally:
        launcher.stop()
        thread.join(timeout=CEILING)
    lock = RunLock(run.lock_file, run.name)
    lock.acquire()  # free once the run's process has exited
    lock.release()


def to_the_process(signum: int) -> None:
    os.kill(os.getpid(), signum)


def to_another_thread(signum: int) -> None:
    # The kernel may hand a process's signal to any of its threads; CPython then runs the handler only when the
    # main thread wakes. This makes that case certain (it had hung the study until its run ended).
    signal.pthread_kill(threading.get_ident(), signum)


@pytest.mark.parametrize("deliver", [to_the_process, to_another_thread], ids=["to the process", "to another thread"])
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_study_stopped_by_a_signal_stops_its_run_and_exits_130(fake_runs, tmp_path, signum, deliver):
    if signal.getsignal(signum) is signal.SIG_IGN:
        # A process started in the background (`cmd &`, nohup) inherits SIGINT ignored: no Ctrl-C can reach it.
        pytest.skip(f"{signal.Signals(signum).name} is ignored in this process (started in the background)")
    pid_file = tmp_path / "run.pid"
    study = fake_runs({"a": SLEEP.format(pid=pid_file)})

    def signal_the_study() -> None:
        wait_for(lambda: pid_file.exists() and pid_file.read_text().isdigit(), "the run to start")
        deliver(signum)  # to this process only: the run must be stopped by the study

    thread = threading.Thread(target=signal_the_study)
    thread.start()
    with pytest.raises(SystemExit) as exited:
        main([str(study)])
    thread.join()
    assert exited.value.code == 130
    assert gone(int(pid_file.read_text()))
    state = json.loads(only_run(study).state_file.read_text())
    assert (state["status"], state["attempts"][0]["returncode"]) == ("interrupted", -signal.SIGTERM)


TRACEBACK = 'Traceback (most recent call last):\n  File "/x/fl/train.py", line 7, in fit\n    step()\n'


@pytest.mark.parametrize(
    ("output", "code", "expected"),
    [
        (TRACEBACK + "ValueError: bad mu\nwandb: Synced 3 files\n", 1, "ValueError: bad mu [fl/train.py:7 in fit]"),
        (
            TRACEBACK + "KeyError: 'influence'\n\nException ignored in: <function X.__del__>\n" + TRACEBACK + "OSError: [Errno 9]\n",
            1,
            "KeyError: 'influence' [fl/train.py:7 in fit]",
        ),
        (TRACEBACK + "torch._dynamo.exc.Unsupported: call_function\n  with details\n", 1, "torch._dynamo.exc.Unsupported: call_function with details [fl/train.py:7 in fit]"),
        (TRACEBACK + "ValueError: earlier\nround 3: val_acc=0.5\n", -9, "killed by signal 9 (SIGKILL); last output: round 3: val_acc=0.5"),
        ("round 3: val_acc=0.5\n", 1, "exit code 1; last output: round 3: val_acc=0.5"),
    ],
    ids=["trailing output", "destructor traceback after", "any exception class", "killed", "no error printed"],
)
def test_a_failed_runs_error_is_its_exception_not_other_output(output: str, code: int, expected: str) -> None:
    assert error_message(output, code) == expected
