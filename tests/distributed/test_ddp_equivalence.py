"""Clients sharded over 2 CPU processes (gloo) give the global weights of 1 process (issue 3).

A 2-process run is ``ddp_run.py`` started by ``torchrun`` (Lightning's own launcher, which re-runs the script for
rank 1, is tested by ``test_cli_ddp.py`` and ``test_hung_peer.py``); the fits that only compare with 1 process
(:mod:`tests.distributed.runs`, this folder's and others') all run in one launch per session, since starting the
processes costs more than the fits. The 1-process reference runs the same ``fit`` in the test process.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from tests.distributed.ddp_run import fit
from tests.distributed.runs import COMPRESSED, SCHEDULED, SUMMED, case_arguments
from tests.distributed.launch import free_port, run_together
from tests.waiting import CEILING

SCRIPT = Path(__file__).with_name("ddp_run.py")
TOLERANCE = 1e-6


def torchrun(*args: str, processes: int = 2) -> list[str]:
    """The command that runs ``ddp_run.py`` as ``processes`` processes started together by ``torchrun`` (the
    Lightning launcher would start rank 1 only once rank 0 has imported everything: twice the start-up)."""
    return [
        sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(processes),
        "--master-addr", "127.0.0.1", "--master-port", str(free_port()), str(SCRIPT), *args,
    ]  # fmt: skip


def run(out: Path, *args: str) -> None:
    """Runs ``ddp_run.py`` as 2 processes (``--devices 2``)."""
    run_together([torchrun("--out", str(out), "--devices", "2", *args)], timeout=CEILING)


def result(out: Path, rank: int = 0) -> dict:
    return torch.load(out / f"rank{rank}.pt")


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max((a[k].double() - b[k].double()).abs().max().item() for k in a)


def finished(runs: tuple[Path, str], name: str) -> Path:
    """The folder of run ``name`` of the session's 2-process launch (:func:`tests.conftest.two_process_runs`); the
    test fails with the launch's report if that run did not finish."""
    folder, failure = runs[0] / name, runs[1]
    if not (folder / "rank1.pt").exists():
        pytest.fail(f"The 2-process launch did not finish {name}:\n{failure}")
    return folder


@pytest.mark.parametrize("case", SUMMED)
def test_two_processes_match_one(tmp_path, two_process_runs, case):
    # Every round metric must match, so Byzantine's round/malicious_clients is counted when clients shard too.
    two_processes_match_one(tmp_path, two_process_runs, case)


@pytest.mark.filterwarnings("ignore:Round .* sent an undecodable payload")
@pytest.mark.parametrize("case", COMPRESSED)
def test_compressed_uploads_are_decoded_and_summed_per_rank(tmp_path, two_process_runs, case):
    # FedMRN (masked noise, FedAvgM server step) and Top-k with malformed uploads of clients 2 and 3,
    # rejected by the rank that trained each: the counts and the mean payload bytes still match. DP over
    # FedMRN clips and sums per rank; the median over FedMRN gathers the decoded updates to every rank.
    metrics = two_processes_match_one(tmp_path, two_process_runs, case)
    assert metrics["round/rejected_clients"] == (2.0 if case.endswith(":corrupt") else 0.0)
    assert metrics["round/payload_bytes"] > 0 and metrics["round/compression_ratio"] > 1


@pytest.mark.parametrize("case", SCHEDULED)
def test_a_step_lr_schedule_gives_two_processes_the_weights_of_one(tmp_path, two_process_runs, case):
    two_processes_match_one(tmp_path, two_process_runs, case)


def two_processes_match_one(tmp_path: Path, runs: tuple[Path, str], case: str) -> dict[str, float]:
    """Runs ``case`` in 1 process, checks it agrees with the session's 2-process run, and returns rank 0's last
    round metrics."""
    two = finished(runs, case)
    fit(tmp_path / "one", **case_arguments(case))
    one, rank0, rank1 = result(tmp_path / "one"), result(two, 0), result(two, 1)

    assert rank0["history"] == one["history"]
    assert max_diff(rank0["global_state"], rank1["global_state"]) == 0.0  # one all-reduce: every rank agrees exactly
    assert max_diff(one["global_state"], rank0["global_state"]) <= TOLERANCE
    assert rank0["metrics"].keys() == one["metrics"].keys()
    for key, value in one["metrics"].items():  # counts, bytes, losses, accuracies, FedALIGN's acceptance
        if key != "round/wall_time_s":
            assert rank0["metrics"][key] == pytest.approx(value, rel=1e-6), key
    return rank0["metrics"]


def test_resume_with_two_processes_matches_one_uninterrupted(tmp_path, two_process_runs):
    # FedAvgM: the server momentum must survive the checkpoint too (2 rounds, then resumed to 4).
    resumed = result(finished(two_process_runs, "fedavgm-resumed"))
    fit(tmp_path / "one", algorithm="fedavgm", rounds=4)
    one = result(tmp_path / "one")

    assert resumed["history"] == one["history"]
    assert max_diff(one["global_state"], resumed["global_state"]) <= TOLERANCE
