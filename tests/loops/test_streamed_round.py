"""Streamed aggregation (fl_lightning/loops/streamed_round.py): each client's update is folded in as it finishes, with
the same bits as the gathered aggregation, without holding the round's updates at once, and atomic when interrupted."""

from __future__ import annotations

import weakref

import pytest
import torch

from fl_lightning import SCAFFOLD, FedAvg, FederatedCallback, FedProx
from fl_lightning.algorithms.shared.server_optimizers import ServerSGD

from ..algorithms.stateful_regression import CLIENTS_PER_ROUND, fit


def gathered(algorithm):
    """``algorithm`` made to aggregate the round's updates all at once (the path without a fold)."""
    algorithm.start_fold = lambda round_idx, global_state: None
    return algorithm


def same_state(a, b) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


CASES = {
    "fedavg-samples": lambda: FedAvg(),
    "fedavgm": lambda: FedAvg(server_optimizer=ServerSGD(lr=0.7, momentum=0.9)),
    "fedprox": lambda: FedProx(mu=0.1),
    "scaffold": lambda: SCAFFOLD(global_lr=0.5),
}


@pytest.mark.parametrize("make", CASES.values(), ids=CASES.keys())
def test_streamed_rounds_give_the_gathered_weights_bit_for_bit(make, tmp_path):
    # float32, 5 rounds of 3 of 8 clients of 20-30 samples (FedAvg weights them by their sample counts); the streamed
    # run also spills every client state (a budget of one byte), through the spill file's set-aside undo entries.
    settings = {"rounds": 5, "precision": "32-true", "default_root_dir": tmp_path}
    budget = {"client_state_memory": 1} if make is CASES["scaffold"] else {}
    streamed_model, streamed = fit(make(), **budget, **settings)
    gathered_model, reference = fit(gathered(make()), **settings)
    assert streamed.fit_loop.history == reference.fit_loop.history
    same_state(streamed_model.state_dict(), gathered_model.state_dict())
    if isinstance(streamed.algorithm, SCAFFOLD):
        same_state(streamed.algorithm.control, reference.algorithm.control)
        ours, theirs = streamed.algorithm.client_controls, reference.algorithm.client_controls
        assert ours.ids() == theirs.ids() and len(ours.spilled_ids()) == len(ours)
        for cid in ours.ids():
            same_state(ours.get(cid), theirs.get(cid))


class LiveUpdates(FederatedCallback):
    """Keeps a weak reference to one tensor of every client's upload, to count those still alive at the server step."""

    def __init__(self) -> None:
        self.refs: list[weakref.ref] = []
        self.alive_at_step: list[int] = []

    def on_client_end(self, trainer, pl_module, client, update) -> None:
        self.refs.append(weakref.ref(next(iter(update.payload.values()))))


@pytest.mark.parametrize("make", [FedAvg, SCAFFOLD], ids=["fedavg", "scaffold"])
@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "gathered"])
def test_a_streamed_round_does_not_hold_its_updates_at_once(make, stream, monkeypatch):
    live = LiveUpdates()
    step = ServerSGD.step

    def counting_step(self, global_state, delta, param_names):
        live.alive_at_step.append(sum(ref() is not None for ref in live.refs))
        live.refs.clear()
        return step(self, global_state, delta, param_names)

    monkeypatch.setattr(ServerSGD, "step", counting_step)
    algorithm = make() if stream else gathered(make())
    fit(algorithm, rounds=2, callbacks=[live])
    # At the server step the gathered path still holds every update of the round; the streamed one none.
    assert live.alive_at_step == ([0, 0] if stream else [CLIENTS_PER_ROUND] * 2)


class FailAtClient(FederatedCallback):
    """Raises when the ``position``-th client of round ``round_idx`` starts; keeps the trainer."""

    def __init__(self, round_idx: int, position: int) -> None:
        self.round_idx, self.position, self.started, self.trainer = round_idx, position, 0, None

    def on_client_start(self, trainer, pl_module, client) -> None:
        self.trainer = trainer
        if client.round_idx == self.round_idx:
            self.started += 1
            if self.started == self.position:
                raise RuntimeError("a client failed")


def test_a_streamed_round_interrupted_between_two_clients_leaves_no_trace():
    # Round 1 fails as its third client starts, after two clients' c_i+ were folded in and stored.
    _, one_round = fit(SCAFFOLD(), rounds=1)
    failing = FailAtClient(1, CLIENTS_PER_ROUND)
    with pytest.raises(RuntimeError, match="a client failed"):
        fit(SCAFFOLD(), rounds=2, callbacks=[failing])
    interrupted = failing.trainer
    assert interrupted.fit_loop.stop_reason is not None and len(interrupted.fit_loop.history) == 2
    same_state(interrupted.lightning_module.state_dict(), one_round.lightning_module.state_dict())
    same_state(interrupted.algorithm.control, one_round.algorithm.control)
    ours, theirs = interrupted.algorithm.client_controls, one_round.algorithm.client_controls
    assert ours.ids() == theirs.ids()
    for cid in ours.ids():
        same_state(ours.get(cid), theirs.get(cid))
