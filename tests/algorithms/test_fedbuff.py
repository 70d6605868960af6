"""FedBuff: the buffer update against a plain-PyTorch replay of the loop's trace, and its weights."""

from __future__ import annotations

import math

import pytest
import torch

from fl_lightning import FedBuff
from fl_lightning.algorithms.shared.algorithm import ClientUpdate
from fl_lightning.participation.speed import ConstantDelay

from .quadratic import CENTRES, Quadratic, quadratic_data, quadratic_trainer

LR, STEPS, BUFFER = 0.1, 2, 2
DISCOUNTS = {"constant": lambda s: 1.0, "inverse": lambda s: 1 / (1 + s), "inverse_sqrt": lambda s: 1 / math.sqrt(1 + s)}


def replay(arrivals, *, server_lr, discount, max_staleness=None):
    """w_{v+1} = w_v + server_lr * sum_j s(tau_j)/b * Delta_j over each buffer of the trace, where
    Delta_j = local(w_pulled) - w_pulled (STEPS full-batch GD steps on ||w - c||^2/2)."""
    versions = [torch.zeros(2, dtype=torch.float64)]
    for k in range(len(arrivals) // BUFFER):
        total = torch.zeros(2, dtype=torch.float64)
        for _, client, pulled in arrivals[k * BUFFER : (k + 1) * BUFFER]:
            staleness = k - pulled
            weight = 0.0 if max_staleness is not None and staleness > max_staleness else DISCOUNTS[discount](staleness) / BUFFER
            total += weight * (1 - (1 - LR) ** STEPS) * (CENTRES[client] - versions[pulled])
        versions.append(versions[k] + server_lr * total)
    return versions


@pytest.mark.parametrize(("discount", "server_lr", "max_staleness"), [("constant", 1.0, None), ("inverse", 0.7, None), ("inverse_sqrt", 1.5, 1)])
def test_matches_the_plain_pytorch_replay(discount, server_lr, max_staleness):
    algorithm = FedBuff(
        buffer_size=BUFFER, delays=ConstantDelay([1.0, 1.5, 4.25]), server_lr=server_lr, staleness_discount=discount, max_staleness=max_staleness
    )
    module = Quadratic(lr=LR)
    trainer = quadratic_trainer(max_epochs=6, algorithm=algorithm, local_steps=STEPS)
    trainer.fit(module, datamodule=quadratic_data(CENTRES[:3]))
    expected = replay(trainer.fit_loop.arrivals, server_lr=server_lr, discount=discount, max_staleness=max_staleness)
    assert torch.allclose(module.w.detach(), expected[-1], atol=1e-12, rtol=0)
    arrivals = trainer.fit_loop.arrivals
    assert any(j // BUFFER > pulled for j, (_, _, pulled) in enumerate(arrivals))  # the trace has stale updates


def update(client: int, staleness: int, payload: dict[str, torch.Tensor]) -> ClientUpdate:
    return ClientUpdate(client_id=client, num_samples=1, num_steps=1, payload=payload, upload_bytes=0, staleness=staleness)


def test_aggregate_moves_integer_buffers_by_the_rounded_increment_and_counts_influence():
    algorithm = FedBuff(buffer_size=2, staleness_discount="inverse")
    algorithm.influence = torch.zeros(3, dtype=torch.float64).numpy()
    state = {"w": torch.zeros(2), "count": torch.tensor(10)}
    buffer = [update(0, 0, {"w": torch.tensor([2.0, 0.0]), "count": torch.tensor(4)}),
              update(2, 1, {"w": torch.tensor([0.0, 4.0]), "count": torch.tensor(4)})]  # fmt: skip
    metrics = algorithm.aggregate(0, state, buffer)
    assert torch.equal(state["w"], torch.tensor([1.0, 1.0]))  # 1/2 * [2, 0] + 1/4 * [0, 4]
    assert state["count"].item() == 13  # 10 + round(0.5 * 4 + 0.25 * 4)
    assert algorithm.influence.tolist() == [0.5, 0.0, 0.25]
    assert metrics == {"mean_staleness": 0.5, "max_staleness": 1.0, "max_weight": 0.5}


def test_a_buffer_whose_weights_are_all_zero_leaves_the_model_unchanged():
    algorithm = FedBuff(buffer_size=1, max_staleness=0)
    algorithm.influence = torch.zeros(1, dtype=torch.float64).numpy()
    state = {"w": torch.ones(2)}
    algorithm.aggregate(3, state, [update(0, 2, {"w": torch.full((2,), 5.0)})])
    assert torch.equal(state["w"], torch.ones(2))


def test_clients_are_dispatched_not_selected():
    with pytest.raises(TypeError, match="FedBuff is asynchronous: clients are dispatched by the AsyncFitLoop"):
        FedBuff().select_clients(0)


def test_clients_per_round_is_overridden_by_concurrency_with_one_warning_naming_it():
    trainer = quadratic_trainer(max_epochs=1, algorithm=FedBuff(buffer_size=1, concurrency=2), clients_per_round=3)
    message = r"FedBuff overrides the trainer's `clients_per_round`: .*concurrency=2 .* not clients_per_round=3"
    with pytest.warns(UserWarning, match=message) as caught:
        trainer.fit(Quadratic(lr=LR), datamodule=quadratic_data())
    assert sum("clients_per_round" in str(w.message) for w in caught) == 1
