"""DP-FedAvg in a federated fit: ε logged every round, training stops at the budget."""

from __future__ import annotations

import pytest

from fl_lightning import DPFedAvg
from fl_lightning.models import MLP
from fl_lightning.privacy import RoundAccountant
from tests.integration.conftest import digits_data, quiet_trainer
from tests.recording_logger import RecordingLogger


def test_fit_logs_epsilon_each_round_and_stops_at_the_budget():
    accountant = RoundAccountant(noise_multiplier=1.0, num_clients=8, clients_per_round=4, sampling="fixed", delta=1e-4)
    budget = (accountant.epsilon(2) + accountant.epsilon(3)) / 2
    logger = RecordingLogger()
    trainer = quiet_trainer(
        algorithm=DPFedAvg(noise_multiplier=1.0, clip_norm=0.5, delta=1e-4, target_epsilon=budget),
        clients_per_round=4,
        local_steps=2,
        max_epochs=10,
        logger=logger,
    )
    with pytest.warns(UserWarning, match="one more round would exceed target_epsilon"):
        trainer.fit(MLP(in_features=64, hidden=(16,), lr=0.1), datamodule=digits_data(num_clients=8))

    assert len(trainer.fit_loop.history) == 2 and trainer.current_epoch == 2
    logged = [metrics["round/dp_epsilon"] for _, metrics in logger.records if "round/dp_epsilon" in metrics]
    assert logged == [accountant.epsilon(1), accountant.epsilon(2)]
    assert [m["round/dp_clip_norm"] for _, m in logger.records if "round/dp_clip_norm" in m] == [0.5, 0.5]
