"""SCAFFOLD's c_i and FedDyn's gradient terms are stored only for updates that reach the model: a dropped
(non-finite) update leaves its client's state as it was, and a rolled-back round undoes every store."""

from __future__ import annotations

import pytest
import torch

from fl_lightning import SCAFFOLD, FedDyn

from ..algorithms.stateful_regression import fit
from .aggregate_helpers import Poison

N = 8
#: (algorithm, its per-client store, its server state, which is the mean of the store over all N clients)
CASES = [(SCAFFOLD, "client_controls", "control"), (FedDyn, "gradients", "h")]


def check_server_state_is_the_mean_of_the_clients(algorithm, store: str, server: str) -> None:
    mean = getattr(algorithm, server)["net.weight"]
    total = sum((s["net.weight"] for _, s in getattr(algorithm, store).items()), torch.zeros_like(mean))
    torch.testing.assert_close(mean, total / N, rtol=0, atol=1e-6)


@pytest.mark.parametrize(("make", "store", "server"), CASES, ids=["scaffold", "feddyn"])
def test_a_dropped_update_leaves_its_clients_state_unchanged(make, store, server):
    with pytest.warns(UserWarning, match="Round 0: client 0 sent a non-finite update"):
        _, trainer = fit(make(), callbacks=[Poison({0}, float("nan"))])
    assert 0 not in getattr(trainer.algorithm, store) and len(getattr(trainer.algorithm, store)) > 0
    check_server_state_is_the_mean_of_the_clients(trainer.algorithm, store, server)


@pytest.mark.parametrize(("make", "store", "server"), CASES, ids=["scaffold", "feddyn"])
def test_a_rolled_back_round_undoes_the_stored_states(make, store, server):
    # Two float32 updates of 2e38 (round 0 trains clients 0, 1 and 7): finite, but their sum overflows.
    with pytest.warns(UserWarning, match=r"Round 0: (SCAFFOLD|FedDyn).s aggregate is not finite"):
        _, trainer = fit(make(), rounds=1, precision="32-true", callbacks=[Poison({0, 1}, 2e38)])
    assert trainer.fit_loop.history == [[0, 1, 7]]
    assert len(getattr(trainer.algorithm, store)) == 0  # the round's only aggregation was undone
    assert float(trainer.callback_metrics["round/rolled_back"]) == 1.0
    check_server_state_is_the_mean_of_the_clients(trainer.algorithm, store, server)
