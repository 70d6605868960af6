"""Per-client state under client sharding: each client trains on its owner rank (id modulo the world size), whose
store alone holds its state, spilled to disk here (a zero memory budget); 2 processes equal 1, across resumes.
The 2-process fits are the session's (:mod:`tests.distributed.runs`)."""

from __future__ import annotations

import pytest
import torch

from tests.distributed.ddp_run import fit
from tests.distributed.runs import STATEFUL
from tests.distributed.test_ddp_equivalence import TOLERANCE, finished, max_diff, result, run



def test_a_stateful_algorithm_on_two_processes_equals_one(tmp_path, two_process_runs):
    fit(tmp_path / "one", **STATEFUL, rounds=4)
    two = finished(two_process_runs, "stateful")
    one, rank0, rank1 = result(tmp_path / "one"), result(two, 0), result(two, 1)
    assert rank0["history"] == one["history"]
    assert len({c for clients in one["history"] for c in clients}) < sum(map(len, one["history"]))  # clients return
    assert max_diff(rank0["global_state"], rank1["global_state"]) == 0.0
    assert max_diff(one["global_state"], rank0["global_state"]) <= TOLERANCE


def test_a_two_process_checkpoint_holds_every_ranks_clients_and_resumes_on_one_or_two(tmp_path, two_process_runs):
    checkpoint = finished(two_process_runs, "stateful-first") / "checkpoints" / "last.ckpt"  # 2 rounds
    saved = torch.load(checkpoint, weights_only=False)["loops"]["fit_loop"]["state_dict"]["federated"]
    trained = sorted({c for clients in saved["history"] for c in clients})
    assert sorted(saved["algorithm"]["sums"]["entries"]) == trained  # both ranks' clients (odd and even ids)
    assert {c % 2 for c in trained} == {0, 1}

    fit(tmp_path / "one", **STATEFUL, rounds=4)
    fit(tmp_path / "resumed-one", **STATEFUL, rounds=4, resume=checkpoint)
    one = result(tmp_path / "one")
    assert set(one["history"][2] + one["history"][3]) & set(trained)  # the resumed rounds read the saved state
    for resumed in (result(finished(two_process_runs, "stateful-resumed")), result(tmp_path / "resumed-one")):
        assert resumed["history"] == one["history"]
        assert max_diff(one["global_state"], resumed["global_state"]) <= TOLERANCE


def test_scaffold_checks_its_controls_over_every_ranks_clients(tmp_path, two_process_runs):
    # The session's run resumed this 2-round checkpoint on 2 processes, each rank holding half the c_i.
    checkpoint = finished(two_process_runs, "scaffold-first") / "checkpoints" / "last.ckpt"
    assert (finished(two_process_runs, "scaffold-resumed") / "rank0.pt").exists()

    state = torch.load(checkpoint, weights_only=False)
    entries = state["loops"]["fit_loop"]["state_dict"]["federated"]["algorithm"]["client_controls"]["entries"]
    for tensor in entries[next(c for c in entries if c % 2)].values():  # a client of rank 1
        tensor.add_(1.0)
    torch.save(state, tmp_path / "tampered.ckpt")
    scaffold = ("--algorithm", "scaffold", "--executor", "lean", "--client-state-memory", "0")  # as runs.SCAFFOLD
    with pytest.raises(AssertionError, match=r"`control\.\S+` is not the mean of the clients' `client_controls`"):
        run(tmp_path / "tampered", "--rounds", "3", "--resume", str(tmp_path / "tampered.ckpt"), *scaffold)
