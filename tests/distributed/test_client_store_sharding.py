"""Per-client state under client sharding: each client trains on its owner rank (id modulo the world size), whose
store alone holds its state, spilled to disk here (a zero memory budget); 2 processes equal 1, across resumes."""

from __future__ import annotations

import pytest
import torch

from tests.distributed.ddp_run import fit
from tests.distributed.test_ddp_equivalence import TOLERANCE, max_diff, result, run

STATEFUL = ("--algorithm", "stateful", "--executor", "lean", "--client-state-memory", "0")


def test_a_stateful_algorithm_on_two_processes_equals_one(tmp_path):
    fit(tmp_path / "one", algorithm="stateful", executor="lean", rounds=4, client_state_memory=0)
    run(tmp_path / "two", "--rounds", "4", *STATEFUL)
    one, rank0, rank1 = result(tmp_path / "one"), result(tmp_path / "two", 0), result(tmp_path / "two", 1)
    assert rank0["history"] == one["history"]
    assert len({c for clients in one["history"] for c in clients}) < sum(map(len, one["history"]))  # clients return
    assert max_diff(rank0["global_state"], rank1["global_state"]) == 0.0
    assert max_diff(one["global_state"], rank0["global_state"]) <= TOLERANCE


def test_a_two_process_checkpoint_holds_every_ranks_clients_and_resumes_on_one_or_two(tmp_path):
    run(tmp_path / "first", "--rounds", "2", *STATEFUL)
    checkpoint = tmp_path / "first" / "checkpoints" / "last.ckpt"
    saved = torch.load(checkpoint, weights_only=False)["loops"]["fit_loop"]["state_dict"]["federated"]
    trained = sorted({c for clients in saved["history"] for c in clients})
    assert sorted(saved["algorithm"]["sums"]["entries"]) == trained  # both ranks' clients (odd and even ids)
    assert {c % 2 for c in trained} == {0, 1}

    fit(tmp_path / "one", algorithm="stateful", executor="lean", rounds=4, client_state_memory=0)
    run(tmp_path / "resumed", "--rounds", "4", "--resume", str(checkpoint), *STATEFUL)
    fit(tmp_path / "resumed-one", algorithm="stateful", executor="lean", rounds=4, resume=checkpoint, client_state_memory=0)
    one = result(tmp_path / "one")
    assert set(one["history"][2] + one["history"][3]) & set(trained)  # the resumed rounds read the saved state
    for resumed in (result(tmp_path / "resumed"), result(tmp_path / "resumed-one")):
        assert resumed["history"] == one["history"]
        assert max_diff(one["global_state"], resumed["global_state"]) <= TOLERANCE


def test_scaffold_checks_its_controls_over_every_ranks_clients(tmp_path):
    scaffold = ("--algorithm", "scaffold", "--executor", "lean", "--client-state-memory", "0")
    run(tmp_path / "first", "--rounds", "2", *scaffold)
    checkpoint = tmp_path / "first" / "checkpoints" / "last.ckpt"
    run(tmp_path / "resumed", "--rounds", "3", "--resume", str(checkpoint), *scaffold)  # each rank holds half the c_i

    state = torch.load(checkpoint, weights_only=False)
    entries = state["loops"]["fit_loop"]["state_dict"]["federated"]["algorithm"]["client_controls"]["entries"]
    for tensor in entries[next(c for c in entries if c % 2)].values():  # a client of rank 1
        tensor.add_(1.0)
    torch.save(state, tmp_path / "tampered.ckpt")
    with pytest.raises(AssertionError, match=r"`control\.\S+` is not the mean of the clients' `client_controls`"):
        run(tmp_path / "tampered", "--rounds", "3", "--resume", str(tmp_path / "tampered.ckpt"), *scaffold)
