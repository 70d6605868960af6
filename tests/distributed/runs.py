"""The 2-process fits that are only compared with fits in the test process, by name: all run one after the other in
one ``torchrun`` launch per session (:func:`tests.conftest.two_process_runs`), since starting 2 processes costs
several times a 3-round fit. A run whose ``resume`` names an earlier run resumes from that run's last checkpoint."""

from __future__ import annotations

from typing import Any

#: The equivalence matrix, as ``ALGORITHM:EXECUTOR:FAULT[:step]``: 5 clients per round over 2 ranks, an uneven 3/2
#: split, so ranks train different numbers of steps.
SUMMED = [
    "fedavg:lightning:none", "fedprox:lean:none", "fedalign:lean:none", "fedavgm:batched:none", "dpfedavg:lean:none",
    "median:lightning:none", "krum:lean:none", "secagg:lean:none", "byzantine:lean:none", "qffedavg:lean:none",
    "scaffold:lean:none", "feddyn:lightning:none",
]  # fmt: skip
COMPRESSED = ["fedmrn:lightning:none", "topk:lean:corrupt", "dpfedmrn:lightning:none", "median-fedmrn:lightning:none"]
#: Ranks train 3 and 2 clients: every client must still start the round's per-step schedule from its start.
SCHEDULED = ["fedavg:lightning:none:step", "fedavg:lean:none:step"]


def case_arguments(case: str) -> dict[str, Any]:
    """The keyword arguments of :func:`tests.distributed.ddp_run.fit` for a matrix ``case``."""
    algorithm, executor, fault, *schedule = case.split(":")
    return {"algorithm": algorithm, "executor": executor, "fault": fault, "step_schedule": schedule == ["step"]}


#: Per-client state spilled to disk (a zero memory budget), each client on its owner rank (id modulo world size).
STATEFUL = {"algorithm": "stateful", "executor": "lean", "client_state_memory": 0}
SCAFFOLD = {"algorithm": "scaffold", "executor": "lean", "client_state_memory": 0}

RUNS: dict[str, dict[str, Any]] = {
    **{case: case_arguments(case) for case in (*SUMMED, *COMPRESSED, *SCHEDULED)},
    # Rank 0's secret, broadcast once: the ranks agree and differ from the seeded run.
    "dpfedavg-secure": {"algorithm": "dpfedavg-secure", "executor": "lean"},
    # The filter gathers every rank's update norms; it rejects one update in round 1.
    "median-filter": {"update_bound": "median", "rounds": 2},
    "stateful": {**STATEFUL, "rounds": 4},
    "stateful-first": {**STATEFUL, "rounds": 2},
    "stateful-resumed": {**STATEFUL, "rounds": 4, "resume": "stateful-first"},
    "scaffold-first": {**SCAFFOLD, "rounds": 2},
    "scaffold-resumed": {**SCAFFOLD, "rounds": 3, "resume": "scaffold-first"},  # each rank holds half the c_i
    # FedAvgM: the server momentum must survive the checkpoint too.
    "fedavgm-first": {"algorithm": "fedavgm", "rounds": 2},
    "fedavgm-resumed": {"algorithm": "fedavgm", "rounds": 4, "resume": "fedavgm-first"},
}
