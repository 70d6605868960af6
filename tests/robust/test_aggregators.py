"""Robust aggregation wrappers: the wrapped server step applies the robust statistic of the deltas."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fl_lightning import FedAvg, FedBuff, ServerSGD
from fl_lightning.algorithms.shared.summable import can_shard
from fl_lightning.robust import Bulyan, CoordinateMedian, Krum, TrimmedMean, rules
from tests.algorithms.test_fedavg import _global_state, _updates, federation  # noqa: F401 (fixture)


def _apply(algorithm, federation, updates):  # noqa: F811
    algorithm.setup(federation)
    before = _global_state(federation.module)
    after = {k: v.clone() for k, v in before.items()}
    algorithm.aggregate(0, after, updates)
    return before, after


def test_median_is_applied_by_the_wrapped_server_optimizer(federation):  # noqa: F811
    updates = _updates(_global_state(federation.module))
    before, after = _apply(CoordinateMedian(algorithm=FedAvg(server_optimizer=ServerSGD(lr=0.5))), federation, updates)
    for name, value in before.items():
        median = np.median(np.stack([u.payload[name].double().numpy() for u in updates]), axis=0)
        if not value.is_floating_point():  # an integer counter advances by the rounded median
            assert int(after[name] - value) == round(float(median))
        else:  # the server learning rate scales parameters; float buffers take the delta as it is
            lr = 0.5 if name in federation.param_names else 1.0
            np.testing.assert_allclose((after[name] - value).numpy(), lr * median, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize(
    ("algorithm", "rule"),
    [
        (TrimmedMean(beta=0.25), lambda x: np.sort(x, axis=0)[1:3].mean(axis=0)),
        (Krum(num_byzantine=0, num_selected=2), lambda x: rules.multi_krum(torch.tensor(x), 0, 2).numpy()),
    ],
    ids=["trimmed-mean", "multi-krum"],
)
def test_the_round_delta_is_the_rule_of_the_flattened_deltas(federation, algorithm, rule):  # noqa: F811
    updates = _updates(_global_state(federation.module), seed=1)
    names = [n for n, t in updates[0].payload.items() if t.is_floating_point()]
    flat = np.stack([np.concatenate([u.payload[n].double().reshape(-1).numpy() for n in names]) for u in updates])
    before, after = _apply(algorithm, federation, updates)
    got = np.concatenate([(after[n] - before[n]).double().reshape(-1).numpy() for n in names])
    np.testing.assert_allclose(got, rule(flat), rtol=1e-5, atol=1e-6)
    assert not np.allclose(got, flat.mean(axis=0))  # not the plain mean


def test_krum_and_bulyan_refuse_too_few_clients_per_round(federation):  # noqa: F811
    with pytest.raises(ValueError, match=r"n > 2f \+ 2 .*n=4 for f=1"):
        Krum(num_byzantine=1).setup(federation)
    with pytest.raises(ValueError, match=r"clients_per_round=4 for num_byzantine=1"):
        Bulyan(num_byzantine=1).setup(federation)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: TrimmedMean(beta=0.5), "beta"),
        (lambda: Krum(num_byzantine=-1), "num_byzantine"),
        (lambda: Krum(num_byzantine=1, num_selected=0), "num_selected"),
        (lambda: CoordinateMedian(algorithm=FedBuff(buffer_size=2)), "sum of client deltas"),
    ],
)
def test_bad_input_is_named(build, message):
    with pytest.raises(ValueError, match=message):
        build()


def test_robust_aggregation_does_not_shard():
    assert not can_shard(CoordinateMedian()) and not can_shard(Krum(num_byzantine=1))
