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
    for inner in (FedAvg(weighting="uniform"), CoordinateMedian()):
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


@pytest.mark.parametrize(
    ("inner", "read"),
    [(lambda: FedAvg(), "sample count"), (lambda: FedALIGN(priority=1, epsilon=0.1), "unnoised losses")],
    ids=["fedavg-samples", "fedalign"],
)
def test_an_algorithm_that_reads_an_unnoised_client_value_is_refused_inside_or_around_it(inner, read):
    """Nobody is trusted: the server reads nothing of a client but its noised payload (issue 38 item 5)."""
    name = type(inner()).__name__
    with pytest.raises(ValueError, match=rf"LocalDP and {name} cannot be combined: {name} reads .*{read}"):
        LocalDP(noise_multiplier=1.0, clip_norm=1.0, algorithm=inner())
    if name == "FedALIGN":
        with pytest.raises(ValueError, match=rf"FedALIGN and LocalDP cannot be combined: FedALIGN reads .*{read}"):
            FedALIGN(priority=1, algorithm=LocalDP(noise_multiplier=1.0, clip_norm=1.0))


@pytest.mark.filterwarnings("ignore:.*secure_mode=False")
@pytest.mark.parametrize("flag", [False, True])
def test_the_default_weighting_is_uniform_and_clients_send_their_loss_only_when_asked(federation, flag):
    algorithm = LocalDP(noise_multiplier=1.0, clip_norm=1.0, log_client_statistics=flag)
    algorithm.setup(federation)
    assert algorithm.inner.weighting == "uniform"
    (update,) = updates_with_norms(global_state(federation), [1.0])
    context = _context(0)
    context.metrics = {"train_loss": 0.25}
    sent = algorithm.client_update(context, federation.module, update.payload)
    assert sent.metrics == ({"train_loss": 0.25} if flag else {})
