"""Calibrating the noise multiplier from a target ε (``noise_multiplier=None``): the smallest z that meets the target
over the run's rounds, checked with dp-accounting directly (tests/privacy/reference.py), not with our accountant."""

from __future__ import annotations

import dataclasses

import dp_accounting as dp
import pytest

from fl_lightning import DPFedAvg
from fl_lightning.privacy import DPFTRL
from fl_lightning.privacy.calibration import RELATIVE_PRECISION
from tests.privacy import reference
from tests.privacy.conftest import make_federation

DELTA = 1e-5


def _federation(clients_per_round: int, rounds: int):
    return dataclasses.replace(make_federation(clients_per_round=clients_per_round), num_rounds=rounds)


def _smallest(epsilon_of, z: float, target: float) -> None:
    """``z`` meets ``target`` and a multiplier a little below it (beyond the calibration's precision) does not."""
    assert epsilon_of(z) <= target
    assert epsilon_of(z / (1 + 2 * RELATIVE_PRECISION)) > target


@pytest.mark.parametrize("target", [1.0, 4.0])
def test_dp_fedavg_poisson_pld_calibrates_the_smallest_multiplier(target):
    algorithm = DPFedAvg(noise_multiplier=None, target_epsilon=target, delta=DELTA, sampling="poisson")
    algorithm.setup(_federation(clients_per_round=1, rounds=20))  # q = 1/4
    _smallest(lambda z: reference.poisson(0.25, z, 20, DELTA, accountant=reference.pld), algorithm.noise_multiplier, target)
    assert algorithm.accountant.noise_multiplier == algorithm.noise_multiplier
    assert algorithm.epsilon(((algorithm.accountant.setting, 20),)) <= target


def test_dp_fedavg_fixed_size_rdp_calibrates_the_smallest_multiplier():
    algorithm = DPFedAvg(noise_multiplier=None, target_epsilon=3.0, delta=DELTA, accounting="rdp")
    algorithm.setup(_federation(clients_per_round=2, rounds=30))
    # Replace-one: one replaced client moves the clipped sum by 2C, so the std over that shift is z / 2.
    _smallest(lambda z: reference.fixed_size_rdp(4, 2, z / 2, 30, DELTA), algorithm.noise_multiplier, 3.0)


def test_dp_ftrl_calibrates_over_its_epochs_of_trees():
    algorithm = DPFTRL(target_epsilon=2.0, delta=DELTA)
    algorithm.setup(_federation(clients_per_round=1, rounds=10))  # 4 clients: epochs of 4, 4 and 2 rounds

    def epsilon_of(z: float) -> float:
        epochs = [dp.SingleEpochTreeAggregationDpEvent(z, steps) for steps in (4, 4, 2)]
        return reference.rdp(dp.ComposedDpEvent(epochs), dp.NeighboringRelation.REPLACE_SPECIAL, DELTA)

    _smallest(epsilon_of, algorithm.noise_multiplier, 2.0)


def test_dp_fedbuff_calibrates_over_its_aggregations():
    from fl_lightning import FedBuff
    from fl_lightning.privacy import DPFedBuff

    algorithm = DPFedBuff(target_epsilon=3.0, clip_norm=1.0, delta=DELTA, algorithm=FedBuff(buffer_size=2))
    algorithm.setup(_federation(clients_per_round=2, rounds=25))  # 25 aggregations, each one Gaussian of multiplier z

    def epsilon_of(z: float) -> float:
        return reference.rdp(dp.SelfComposedDpEvent(dp.GaussianDpEvent(z), 25), reference.ADD_OR_REMOVE, DELTA)

    _smallest(epsilon_of, algorithm.noise_multiplier, 3.0)


def test_bad_calibration_requests_are_one_error_each():
    with pytest.raises(ValueError, match="needs `noise_multiplier`, or `target_epsilon`"):
        DPFedAvg()
    with pytest.raises(ValueError, match="exactly one of `noise_multiplier` and `target_epsilon`"):
        DPFTRL(noise_multiplier=1.0, target_epsilon=2.0)
    with pytest.raises(ValueError, match="set max_epochs"):
        DPFedAvg(target_epsilon=1.0).setup(_federation(clients_per_round=2, rounds=None))
    with pytest.raises(ValueError, match="No noise_multiplier up to 10000 keeps epsilon <= target_epsilon=1e-09 over 10 rounds"):
        DPFTRL(target_epsilon=1e-9).setup(_federation(clients_per_round=1, rounds=10))


def test_a_calibrated_fit_runs_every_round_and_ends_at_most_at_the_target():
    from fl_lightning import FederatedTrainer
    from fl_lightning.data import Digits, FederatedDataModule
    from fl_lightning.models import MLP
    from tests.quiet import QUIET

    data = FederatedDataModule(Digits(split="train"), num_clients=20, batch_size=16, seed=0)
    algorithm = DPFedAvg(target_epsilon=5.0, delta=1e-3, clip_norm=0.5)
    trainer = FederatedTrainer(**QUIET, algorithm=algorithm, clients_per_round=5, max_epochs=3, limit_val_batches=0, seed=0)
    trainer.fit(MLP(in_features=64, hidden=(16,), lr=0.1), datamodule=data)
    assert trainer.fit_loop.epoch_progress.current.completed == 3 and algorithm.rounds_spent == 3
    epsilon = float(trainer.callback_metrics["round/dp_epsilon"])
    assert 0.9 * 5.0 < epsilon <= 5.0  # the smallest multiplier spends nearly all of it
