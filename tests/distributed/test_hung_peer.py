"""Issue 25 item 9: a frozen rank (SIGSTOP, as a hung node) ends a 2-process run within the
strategy's ``timeout`` with one clear error, and the run resumes from its last round's checkpoint
to the weights of one uninterrupted process."""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

from tests.distributed.ddp_run import fit
from tests.distributed.launch import _kill_session, child_env
from tests.distributed.test_ddp_equivalence import TOLERANCE, max_diff, result, torchrun

#: The rendezvous waits as long: both ranks start together (torchrun), so it covers their difference in start-up only.
TIMEOUT_S = 30


def test_a_frozen_peer_ends_the_run_within_its_timeout_and_the_run_resumes(tmp_path: Path) -> None:
    frozen = tmp_path / "frozen"
    # Started by torchrun: Lightning's launcher would start rank 1 only after rank 0 had imported everything, which on a
    # loaded machine alone outlasts the timeout (that launcher is tested by test_cli_ddp.py).
    command = torchrun("--out", str(frozen), "--devices", "2", "--algorithm", "fedavgm", "--fault", "freeze", "--timeout", str(TIMEOUT_S))
    with tempfile.TemporaryFile("w+") as log:
        # The frozen rank 1 keeps the output open, so its end is not awaited.
        proc = subprocess.Popen(command, env=child_env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            proc.wait(timeout=300)  # a generous bound for a loaded machine; torch's default would be 30 min
        finally:
            _kill_session(proc)  # SIGKILL ends the stopped rank
        log.seek(0)
        output = log.read()
    assert proc.returncode != 0, output[-4000:]
    expected = "PeerFailureError: Rank 0: a round's all-reduce failed, most likely because another process hung"
    assert expected in output, output[-4000:]
    assert f"waits 0:00:{TIMEOUT_S}" in output

    # Resumed in this process: a 2-process checkpoint resumes on 1 process or 2 to the same weights (test_ddp_equivalence,
    # test_client_store_sharding); what this adds is that the hung run left a whole checkpoint of its last round.
    fit(tmp_path / "resumed", algorithm="fedavgm", resume=frozen / "checkpoints" / "last.ckpt")
    fit(tmp_path / "one", algorithm="fedavgm")
    resumed, one = result(tmp_path / "resumed"), result(tmp_path / "one")
    assert resumed["history"] == one["history"]
    assert max_diff(one["global_state"], resumed["global_state"]) <= TOLERANCE
