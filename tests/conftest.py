"""Suite-wide settings."""

from __future__ import annotations

import compileall
import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.once import once_per_session

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
#: The processes the suite starts (pytest-xdist's workers too) skip torchmetrics' optional imports
#: (tests/startup/sitecustomize.py); test_cli_output's quickstart run starts as a user's process does, without it.
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).parent / "startup"), os.environ.get("PYTHONPATH")]))


def pytest_configure(config: pytest.Config) -> None:
    """Compiles the package's modules to bytecode once, in the controlling process: each process the suite starts
    (torchrun ranks, CLI and study runs, fresh-import checks) then loads it instead of compiling ~230 modules again,
    which an editable install never does and ``PYTHONDONTWRITEBYTECODE=1`` forbids (1-2 s per process that imports
    the CLI; a normal ``pip install`` compiles them too)."""
    spec = importlib.util.find_spec("fl_lightning")
    if not hasattr(config, "workerinput") and spec is not None and spec.origin is not None:
        compileall.compile_dir(Path(spec.origin).parent, quiet=1)


@pytest.fixture(autouse=True, scope="session")
def private_config_home(tmp_path_factory: pytest.TempPathFactory):
    """Secure-mode runs write their ledger key under ``$XDG_CONFIG_HOME`` (:mod:`fl_lightning.privacy.ledger_seal`):
    the suite's, not the user's."""
    previous = os.environ.get("XDG_CONFIG_HOME")
    os.environ["XDG_CONFIG_HOME"] = str(tmp_path_factory.mktemp("config"))
    yield
    if previous is None:
        del os.environ["XDG_CONFIG_HOME"]
    else:
        os.environ["XDG_CONFIG_HOME"] = previous


@pytest.fixture(autouse=True, scope="session")
def one_thread_per_worker():
    """One intra-op thread per test process: pytest-xdist already runs one process per core,
    and torch's extra threads on tiny tensors only contend (a 16x10 cross-entropy took ~5 ms
    with 2 threads on a loaded 2-core machine, ~5 us with 1)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="session")
def two_process_runs(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> tuple[Path, str]:
    """Every fit of :data:`tests.distributed.runs.RUNS` on 2 processes, in one ``torchrun`` launch per session: the
    folder of their results (``<folder>/<name>/rank<r>.pt``) and the launch's failure report (empty if none)."""
    from tests.distributed.runs import RUNS
    from tests.distributed.test_ddp_equivalence import run

    return once_per_session(tmp_path_factory, worker_id, "two_process_runs", lambda out: run(out, "--runs", *RUNS))


@pytest.fixture(scope="session")
def fresh_process(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Callable[[str], Any]:
    """The value of a check of :mod:`tests.fresh_process`, all run in one fresh interpreter per session; a check
    that raised fails the test that asks for it, with its traceback."""

    def run_checks(folder: Path) -> None:
        folder.mkdir()
        command = [sys.executable, "-m", "tests.fresh_process", str(folder / "results.json")]
        result = subprocess.run(command, cwd=Path(__file__).parents[1], capture_output=True, text=True, check=False)
        assert result.returncode == 0, result.stderr[-4000:]

    folder, failure = once_per_session(tmp_path_factory, worker_id, "fresh_process", run_checks)

    def value(check: str) -> Any:
        if failure:
            pytest.fail(f"The fresh interpreter failed:\n{failure}")
        result = json.loads((folder / "results.json").read_text())[check]
        if "error" in result:
            pytest.fail(f"{check} raised in the fresh interpreter:\n{result['error']}")
        return result["value"]

    return value


@pytest.fixture
def cli_in_tmp_path(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """For CLI tests: run in ``tmp_path`` (relative log and checkpoint paths land there), with no pytest
    arguments in ``sys.argv`` (they are not the CLI's) and without the CLI's traceback switch."""
    from fl_lightning.cli.errors import DEBUG_ENV

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["fl-lightning"])
    monkeypatch.delenv(DEBUG_ENV, raising=False)
