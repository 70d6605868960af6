"""Robust rules over each asynchronous buffer and Byzantine clients in FedBuff, against NumPy references."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fl_lightning import FedALIGN, FedBuff, FedStaleWeight
from fl_lightning.participation.speed import ConstantDelay, UniformDelay
from fl_lightning.robust import Bulyan, Byzantine, CoordinateMedian, SignFlip, TrimmedMean
from tests.algorithms.quadratic import CENTRES, Quadratic, quadratic_data, quadratic_trainer

CLIENTS = torch.cat([CENTRES, CENTRES + torch.tensor([1.0, -2.0], dtype=torch.float64)])  # 8 devices


def _record_buffers(algorithm, method: str) -> list[dict]:
    """Replaces ``algorithm.<method>`` by a spy keeping each buffer's payloads, staleness and global step."""
    buffers: list[dict] = []
    original = getattr(algorithm, method)

    def spy(round_idx, global_state, updates, *args):
        before = global_state["w"].clone()
        metrics = original(round_idx, global_state, updates, *args)
        rows = np.stack([u.payload["w"].numpy() for u in updates])
        staleness = [u.staleness for u in updates]
        buffers.append({"rows": rows, "staleness": staleness, "ids": [u.client_id for u in updates], "step": (global_state["w"] - before).numpy()})
        return metrics

    setattr(algorithm, method, spy)
    return buffers


@pytest.mark.parametrize(
    ("make_rule", "reference"),
    [
        (CoordinateMedian, lambda x: np.median(x, axis=0)),
        (lambda **kw: TrimmedMean(beta=0.25, **kw), lambda x: np.sort(x, axis=0)[1:3].mean(axis=0)),
    ],
    ids=["median", "trimmed-mean"],
)
def test_each_buffer_applies_the_rule_of_its_updates_scaled_by_the_discounted_weight(make_rule, reference):
    fedbuff = FedBuff(buffer_size=4, server_lr=0.5, staleness_discount="inverse", delays=UniformDelay(1.0, 3.0))
    buffers = _record_buffers(fedbuff, "aggregate_with")
    quadratic_trainer(max_epochs=6, algorithm=make_rule(algorithm=fedbuff), local_steps=2).fit(Quadratic(), datamodule=quadratic_data(CLIENTS))

    assert len(buffers) == 6 and any(max(b["staleness"]) > 0 for b in buffers)  # stale updates are discounted
    means = []
    for b in buffers:
        total_weight = sum(1.0 / (1.0 + s) / 4 for s in b["staleness"])  # FedBuff's alpha_j, "inverse" discount
        np.testing.assert_allclose(b["step"], 0.5 * total_weight * reference(b["rows"]), rtol=1e-12, atol=1e-14)
        means.append(np.allclose(b["step"], 0.5 * total_weight * b["rows"].mean(axis=0)))
    assert not all(means)  # the rule, not the mean (they may agree on a symmetric buffer)


def test_fedstaleweight_buffers_take_the_rule_with_their_fairness_weights_total():
    fsw = FedStaleWeight(buffer_size=4, delays=UniformDelay(1.0, 3.0))
    weights: list[list[float]] = []
    buffer_weights = fsw.buffer_weights
    fsw.buffer_weights = lambda updates: weights.append(buffer_weights(updates)) or weights[-1]  # type: ignore[method-assign]
    buffers = _record_buffers(fsw, "aggregate_with")
    quadratic_trainer(max_epochs=4, algorithm=CoordinateMedian(algorithm=fsw), local_steps=2).fit(Quadratic(), datamodule=quadratic_data(CLIENTS))
    for b, w in zip(buffers, weights, strict=True):
        np.testing.assert_allclose(b["step"], sum(w) * np.median(b["rows"], axis=0), rtol=1e-12, atol=1e-14)


def test_byzantine_clients_send_poisoned_updates_in_every_buffer_they_reach():
    def run(fraction: float):
        fedbuff = FedBuff(buffer_size=4, delays=ConstantDelay([1.0] * 8))  # equal speeds: the first buffer is the first pass
        algorithm = Byzantine(attack=SignFlip(scale=2.0), fraction=fraction, algorithm=fedbuff)
        buffers = _record_buffers(fedbuff, "aggregate")
        trainer = quadratic_trainer(max_epochs=2, algorithm=algorithm, local_steps=2)
        trainer.fit(Quadratic(), datamodule=quadratic_data(CLIENTS))
        return algorithm, buffers, trainer

    attacked, poisoned, trainer = run(0.25)
    _, honest, _ = run(0.0)
    assert len(attacked.malicious) == 2
    first, reference = poisoned[0], honest[0]
    assert first["ids"] == reference["ids"]
    for row, expected, cid in zip(first["rows"], reference["rows"], first["ids"]):
        np.testing.assert_allclose(row, -2.0 * expected if cid in attacked.malicious else expected, rtol=1e-12)
    last_buffer = poisoned[-1]["ids"]
    assert trainer.callback_metrics["round/malicious_clients"] == sum(c in attacked.malicious for c in last_buffer)


def test_a_rule_over_a_buffer_checks_its_condition_against_the_buffer_size():
    with pytest.raises(ValueError, match=r"buffer_size=4 for num_byzantine=1"):
        quadratic_trainer(max_epochs=1, algorithm=Bulyan(num_byzantine=1, algorithm=FedBuff(buffer_size=4))).fit(
            Quadratic(), datamodule=quadratic_data(CLIENTS)
        )


def test_a_wrapper_runs_asynchronously_when_its_algorithm_does_and_fedalign_refuses_to():
    assert CoordinateMedian(algorithm=FedBuff(buffer_size=2)).asynchronous and not CoordinateMedian().asynchronous
    with pytest.raises(ValueError, match="FedALIGN selects each round's clients; FedBuff is asynchronous"):
        FedALIGN(priority=1, algorithm=FedBuff(buffer_size=2))
