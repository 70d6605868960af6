"""Local DP: each upload is the clipped delta plus N(0, z²C²); ε of the Gaussian mechanism with sensitivity 2C."""

from __future__ import annotations

import math

import dp_accounting as dp
import numpy as np
import pytest
import torch

from fl_lightning import CompressedFedAvg, FedALIGN, FedAvg, FedSoft
from fl_lightning.algorithms import ClientContext
from fl_lightning.compression import StochasticSignCodec
from fl_lightning.privacy import LocalDP
from fl_lightning.robust import Byzantine, CoordinateMedian, SignFlip
from tests.privacy.conftest import global_state, updates_with_norms


def _context(cid: int) -> ClientContext:
    return ClientContext(round_idx=0, client_id=cid, num_samples=10, num_epochs=1, num_steps=None, seed=100 + cid)


def test_upload_is_clipped_delta_plus_noise_of_std_z_c(federation):
    algorithm = LocalDP(noise_multiplier=0.5, clip_norm=2.0)
    algorithm.setup(federation)
    (update,) = updates_with_norms(global_state(federation), [8.0])
    sent = algorithm.client_update(_context(0), federation.module, update.payload).payload
    noise = np.concatenate(
        [(sent[n] - update.payload[n] * 0.25).reshape(-1).numpy() for n in sent if sent[n].is_floating_point()]
    )
    # 100 104 draws: 1 % is 4.5 standard errors of the sample std.
    assert noise.std() == pytest.approx(1.0, rel=0.01) and abs(noise.mean()) < 5 / math.sqrt(noise.size)
    assert sent["bn.num_batches_tracked"] == 0  # counters are not released
    again = algorithm.client_update(_context(0), federation.module, update.payload).payload
    assert torch.equal(again["fc.weight"], sent["fc.weight"])  # seeded by the client's seed


def test_epsilon_is_the_gaussian_mechanism_with_sensitivity_two_c(federation):
    algorithm = LocalDP(noise_multiplier=4.0, clip_norm=1.0, delta=1e-5)
    algorithm.setup(federation)
    updates = updates_with_norms(global_state(federation), [1.0, 1.0])
    epsilons = [algorithm.aggregate(r, global_state(federation), updates)["local_dp_epsilon"] for r in range(3)]
    accountant = dp.rdp.RdpAccountant()
    accountant.compose(dp.SelfComposedDpEvent(dp.GaussianDpEvent(2.0), 3))
    assert epsilons[2] == accountant.get_epsilon(1e-5) and epsilons[0] < epsilons[1] < epsilons[2]


def test_composes_with_delta_uploads_only():
    for inner in (FedAvg(), CoordinateMedian(), FedALIGN(priority=1, epsilon=0.1)):
        LocalDP(noise_multiplier=1.0, clip_norm=1.0, algorithm=inner)
    for inner in (
        FedSoft(num_clusters=2),
        CompressedFedAvg(codec=StochasticSignCodec()),
        Byzantine(attack=SignFlip(), fraction=0.1),
    ):
        with pytest.raises(ValueError, match="uploads something else"):
            LocalDP(noise_multiplier=1.0, clip_norm=1.0, algorithm=inner)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"noise_multiplier": 0.0}, "noise_multiplier"), ({"clip_norm": 0.0}, "clip_norm"), ({"delta": 1.0}, "delta")],
)
def test_bad_input_is_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        LocalDP(**{"noise_multiplier": 1.0, "clip_norm": 1.0, **kwargs})
