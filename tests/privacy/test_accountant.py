"""RoundAccountant: ε equals dp-accounting's own computation for both sampling schemes."""

from __future__ import annotations

import math

import dp_accounting as dp
import pytest

from fl_lightning.privacy import RoundAccountant
from fl_lightning.privacy import accountant as accountant_module


def _library_epsilon(event: dp.DpEvent, relation: dp.NeighboringRelation, delta: float) -> float:
    accountant = dp.rdp.RdpAccountant(neighboring_relation=relation)
    accountant.compose(event)
    return accountant.get_epsilon(delta)


def test_poisson_epsilon_is_the_librarys():
    ours = RoundAccountant(noise_multiplier=1.1, num_clients=1000, clients_per_round=50, sampling="poisson", delta=1e-5)
    event = dp.SelfComposedDpEvent(dp.PoissonSampledDpEvent(0.05, dp.GaussianDpEvent(1.1)), 40)
    expected = _library_epsilon(event, dp.NeighboringRelation.ADD_OR_REMOVE_ONE, 1e-5)
    assert ours.epsilon(40) == expected
    assert 0 < ours.epsilon(1) < ours.epsilon(20) < ours.epsilon(40)  # composition spends more


def test_fixed_size_epsilon_is_the_librarys_replace_one():
    ours = RoundAccountant(noise_multiplier=1.1, num_clients=100, clients_per_round=10, sampling="fixed", delta=1e-5)
    event = dp.SelfComposedDpEvent(dp.SampledWithoutReplacementDpEvent(100, 10, dp.GaussianDpEvent(1.1)), 30)
    assert ours.epsilon(30) == _library_epsilon(event, dp.NeighboringRelation.REPLACE_ONE, 1e-5)


def test_no_rounds_cost_nothing_and_no_noise_is_infinite():
    ours = RoundAccountant(noise_multiplier=0.0, num_clients=10, clients_per_round=2, sampling="fixed", delta=1e-5)
    assert ours.epsilon(0) == 0.0 and ours.epsilon(3) == math.inf


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"delta": 0.0}, "delta"),
        ({"delta": 1.0}, "delta"),
        ({"sampling": "any"}, "sampling"),
        ({"clients_per_round": 11}, "clients_per_round"),
    ],
)
def test_bad_input_is_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        RoundAccountant(
            **{"noise_multiplier": 1.0, "num_clients": 10, "clients_per_round": 2, "sampling": "fixed", "delta": 1e-5, **kwargs}
        )


def test_missing_library_names_the_extra(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "dp_accounting", None)  # import now raises ImportError
    with pytest.raises(ImportError, match=r'pip install "fl-lightning\[privacy\]"'):
        accountant_module.import_dp_accounting()
