"""FederatedFitLoop with a fake algorithm: the round's hook order, what each hook sees, and the services."""

from __future__ import annotations

import pytest
import torch

from fl_lightning import Algorithm, ClientUpdate
from fl_lightning.algorithms.shared.aggregation import apply_delta, weighted_average
from fl_lightning.loops.loop_services import LoopServices

from ..algorithms.quadratic import CENTRES, Quadratic, quadratic_data, quadratic_trainer

LR, STEPS = 0.1, 3


class Recording(Algorithm):
    """Two clients a round (``r % 4`` and ``(r + 1) % 4``), uniform mean delta; records every hook."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def select_clients(self, round_idx):
        self.calls.append(("select", round_idx))
        self.federation.services.report_round_metrics({"first_selected": float(round_idx % 4)})
        return sorted({round_idx % 4, (round_idx + 1) % 4})

    def configure_client(self, client, module, global_state):
        # The loop has loaded the global weights into the module, in place, before this hook.
        self.calls.append(("configure", client.client_id, module.w.detach().clone(), global_state["w"].clone()))

    def client_update(self, client, module, delta):
        self.calls.append(("update", client.client_id, delta["w"].clone(), client.completed_steps))
        return super().client_update(client, module, delta)

    def aggregate(self, round_idx, global_state, updates: list[ClientUpdate]):
        self.calls.append(("aggregate", round_idx, [u.client_id for u in updates]))
        apply_delta(global_state, weighted_average([u.payload for u in updates], [1.0] * len(updates)))
        return {"aggregated_by_fake": 1.0}

    def evaluate(self, round_idx, module):
        self.calls.append(("evaluate", round_idx, module.w.detach().clone()))
        return {}


def fit(rounds: int, algorithm: Algorithm, **kwargs):
    module = Quadratic(lr=LR)
    trainer = quadratic_trainer(max_epochs=rounds, algorithm=algorithm, local_steps=STEPS, **kwargs)
    trainer.fit(module, datamodule=quadratic_data())
    return module, trainer


def test_hook_order_and_what_each_hook_sees():
    algorithm = Recording()
    module, trainer = fit(2, algorithm)
    assert [c[:2] if c[0] != "aggregate" else c for c in algorithm.calls] == [
        ("select", 0), ("configure", 0), ("update", 0), ("configure", 1), ("update", 1), ("aggregate", 0, [0, 1]), ("evaluate", 0),
        ("select", 1), ("configure", 1), ("update", 1), ("configure", 2), ("update", 2), ("aggregate", 1, [1, 2]), ("evaluate", 1),
    ]  # fmt: skip
    # Closed form: STEPS full-batch GD steps on ||w - c||^2/2 move w by (1 - (1 - lr)^s)(c - w).
    shrink = 1 - (1 - LR) ** STEPS
    w = torch.zeros(2, dtype=torch.float64)
    for round_idx, clients in enumerate([[0, 1], [1, 2]]):
        configures = [c for c in algorithm.calls if c[0] == "configure"][2 * round_idx : 2 * round_idx + 2]
        updates = [c for c in algorithm.calls if c[0] == "update"][2 * round_idx : 2 * round_idx + 2]
        for (_, _, local, centre), (_, cid, delta, steps) in zip(configures, updates):
            assert torch.equal(local, centre) and torch.allclose(local, w, atol=1e-12)  # every client starts from the global model
            assert torch.allclose(delta, shrink * (CENTRES[cid] - w), atol=1e-12) and steps == STEPS
        w = w + torch.stack([shrink * (CENTRES[c] - w) for c in clients]).mean(dim=0)
        evaluated = [c for c in algorithm.calls if c[0] == "evaluate"][round_idx][2]
        assert torch.allclose(evaluated, w, atol=1e-12)  # evaluate sees the new global model
    assert torch.allclose(module.w.detach(), w, atol=1e-12)
    assert trainer.fit_loop.history == [[0, 1], [1, 2]]


def test_round_row_holds_the_counts_the_algorithms_metrics_and_the_selection_channel():
    _, trainer = fit(2, Recording())
    metrics = trainer.callback_metrics
    assert metrics["round/first_selected"] == 1.0  # reported in select_clients of round 1
    assert metrics["round/aggregated_by_fake"] == 1.0
    assert metrics["round/clients"] == metrics["round/aggregated_clients"] == 2.0
    assert metrics["round/dropped_clients"] == metrics["round/rejected_clients"] == metrics["round/rolled_back"] == 0.0


class BadSelection(Recording):
    def select_clients(self, round_idx):
        return [1, 1]


def test_selection_with_repeated_ids_fails_naming_them():
    with pytest.raises(ValueError, match=r"BadSelection.select_clients returned \[1, 1\]: client ids must be distinct and in 0..3"):
        fit(1, BadSelection())


class ServiceUser(Recording):
    """Asks the loop's services for the accumulation factor, optimizer state and a second training run."""

    def configure_client(self, client, module, global_state):
        services = self.federation.services
        self.seen = (type(services), services.accumulate_grad_batches, services.optimizer_states())

    again: ClientUpdate | None = None
    retraining = False

    def client_update(self, client, module, delta):
        if not self.retraining and self.again is None:  # once, and not from inside the second run
            self.retraining = True
            self.again = self.federation.services.train_client(client.round_idx, client.client_id, seed=client.seed)
        return super().client_update(client, module, delta)


def test_services_reach_the_trainer_for_the_algorithm():
    algorithm = ServiceUser()
    fit(1, algorithm, accumulate_grad_batches=1)
    services_type, accumulation, optimizer_states = algorithm.seen
    assert services_type is LoopServices and accumulation == 1
    assert optimizer_states == [{}]  # plain SGD without momentum keeps no state
    shrink = 1 - (1 - LR) ** STEPS
    assert torch.allclose(algorithm.again.payload["w"], shrink * CENTRES[0], atol=1e-12)  # the same run, from the global model
