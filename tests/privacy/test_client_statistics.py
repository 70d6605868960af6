"""A DP run logs no unnoised client statistic unless its mechanism's ``log_client_statistics`` asks (issue 38 item 8)."""

from __future__ import annotations

import pytest

from fl_lightning import DPFedAvg, FedAvg, FedBuff
from fl_lightning.loops.round_log import CLIENT_STATISTICS
from fl_lightning.participation.speed import ConstantDelay
from fl_lightning.privacy import DPFedBuff, LocalDP
from tests.algorithms.quadratic import CENTRES, Quadratic, quadratic_data, quadratic_trainer
from tests.recording_logger import RecordingLogger

MECHANISMS = {
    "DPFedAvg": lambda flag: DPFedAvg(noise_multiplier=1.0, clip_norm=1.0, log_client_statistics=flag),
    "DPFedBuff": lambda flag: DPFedBuff(
        noise_multiplier=1.0, clip_norm=1.0, log_client_statistics=flag, algorithm=FedBuff(buffer_size=2, delays=ConstantDelay(1.0))
    ),
    "LocalDP": lambda flag: LocalDP(noise_multiplier=1.0, clip_norm=1.0, log_client_statistics=flag),
}


def _logged_keys(algorithm) -> set[str]:
    logger = RecordingLogger()
    trainer = quadratic_trainer(max_epochs=2, algorithm=algorithm, local_steps=1, clients_per_round=2, logger=logger)
    trainer.fit(Quadratic(), datamodule=quadratic_data(CENTRES))
    return {key for _, metrics in logger.records for key in metrics}


@pytest.mark.filterwarnings("ignore:.*secure_mode=False")
@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_a_dp_run_logs_unnoised_client_statistics_only_when_asked(mechanism):
    hidden, shown = (_logged_keys(MECHANISMS[mechanism](flag)) for flag in (False, True))
    assert not hidden & CLIENT_STATISTICS, hidden & CLIENT_STATISTICS
    assert {"round/train_loss", "round/clients", "round/upload_bytes"} <= shown  # the flag brings them back
    assert {"round/dp_epsilon", "round/local_dp_epsilon"} & hidden  # what the mechanism releases is still logged


def test_without_dp_the_client_statistics_are_logged():
    assert {"round/train_loss", "round/clients"} <= _logged_keys(FedAvg())


@pytest.mark.parametrize("build", MECHANISMS.values(), ids=list(MECHANISMS))
def test_log_client_statistics_must_be_a_bool(build):
    with pytest.raises(ValueError, match="log_client_statistics must be a bool .*got 'false'"):
        build("false")
