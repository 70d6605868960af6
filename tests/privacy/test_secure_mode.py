"""Secure mode (issue 24 item 4): DP noise, Poisson membership and LocalDP noise that the run's public seed
cannot regenerate, distributed as claimed; research mode reproducible, with one warning naming the option."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
from scipy import stats

from fl_lightning import DPFedAvg, FedBuff
from fl_lightning.algorithms import ClientContext
from fl_lightning.privacy import DPFedBuff, LocalDP
from fl_lightning.privacy.dp_fedavg import clipped_sum
from fl_lightning.privacy.noise import SecretNoise, SeededNoise
from tests.privacy.conftest import global_state, make_federation, updates_with_norms


def _released_noise(secure_mode: bool, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """The noise one round of DPFedAvg added to the clipped sum of ``fc.weight``, and the noise the seed gives."""
    federation = make_federation(seed=seed)
    algorithm = DPFedAvg(noise_multiplier=1.0, clip_norm=1.0, secure_mode=secure_mode)
    algorithm.setup(federation)
    state = global_state(federation)
    updates = updates_with_norms(state, [0.5, 3.0, 1.0, 2.0])
    after = {k: v.clone() for k, v in state.items()}
    algorithm.aggregate(0, after, updates)
    total, _ = clipped_sum([u.payload for u in updates], 1.0)
    noise = (after["fc.weight"] - state["fc.weight"]).double() * 4 - total["fc.weight"].double()
    regenerated = SeededNoise(federation.generator("dp_noise", 0)).normal(state["fc.weight"].shape)  # the names' order
    return noise, regenerated


def test_research_mode_noise_is_regenerated_from_the_seed_and_secure_mode_noise_is_not():
    noise, regenerated = _released_noise(secure_mode=False)
    torch.testing.assert_close(noise, regenerated, atol=1e-5, rtol=0)  # whoever knows the seed strips it
    noise, regenerated = _released_noise(secure_mode=True)
    assert noise.std() == pytest.approx(1.0, rel=0.02)  # 100 000 draws of std zC = 1
    assert abs(float(np.corrcoef(noise.reshape(-1), regenerated.reshape(-1))[0, 1])) < 0.02
    again, _ = _released_noise(secure_mode=True)  # same seed, new secret
    assert abs(float(np.corrcoef(noise.reshape(-1), again.reshape(-1))[0, 1])) < 0.02


def test_secret_noise_is_standard_normal_and_uniform():
    source = SecretNoise(bytes(32), "test")
    normal = source.normal((200_000,)).numpy()
    uniform = source.uniform(200_000).numpy()
    assert stats.kstest(normal, "norm").pvalue > 1e-3  # a correct sampler fails this one time in a thousand
    assert stats.kstest(uniform, "uniform").pvalue > 1e-3
    assert source.normal((3, 4), torch.float32).dtype == torch.float32 and source.normal((0,)).numel() == 0
    same = SecretNoise(bytes(32), "test").normal((200_000,)).numpy()
    assert np.array_equal(normal, same)  # one secret gives every rank the same draws
    assert not np.array_equal(normal[:10], SecretNoise(bytes(32), "other").normal((10,)).numpy())


def test_secure_poisson_membership_is_not_the_seeds():
    federation = make_federation(clients_per_round=2)
    research, secure = (DPFedAvg(noise_multiplier=1.0, sampling="poisson", secure_mode=mode) for mode in (False, True))
    research.setup(federation)
    secure.setup(federation)
    rounds = range(400)
    research_picks, secure_picks = [research.select_clients(r) for r in rounds], [secure.select_clients(r) for r in rounds]
    assert research_picks[:20] == [research.select_clients(r) for r in range(20)]  # reproducible from the seed
    assert sum(a == b for a, b in zip(research_picks, secure_picks)) < 40  # P(same subset of 4) = 1/16: 25 expected
    assert np.mean([len(p) for p in secure_picks]) == pytest.approx(2.0, abs=0.2)  # Binomial(4, 1/2): se 0.05


def test_secure_local_dp_noise_is_not_the_client_seeds():
    federation = make_federation()
    (update,) = updates_with_norms(global_state(federation), [0.5])
    context = ClientContext(round_idx=0, client_id=0, num_samples=10, num_epochs=1, num_steps=None, seed=7)
    sent = []
    for secure_mode in (False, False, True, True):
        algorithm = LocalDP(noise_multiplier=1.0, clip_norm=1.0, secure_mode=secure_mode)
        algorithm.setup(federation)
        sent.append(algorithm.client_update(context, federation.module, update.payload).payload["fc.weight"])
    assert torch.equal(sent[0], sent[1]) and not torch.equal(sent[2], sent[3]) and not torch.equal(sent[0], sent[2])
    noise = (sent[2] - update.payload["fc.weight"]).double()
    assert noise.std() == pytest.approx(1.0, rel=0.02) and abs(float(noise.mean())) < 5 / math.sqrt(noise.numel())


@pytest.mark.parametrize(
    ("build", "owner"),
    [
        (lambda mode: DPFedAvg(noise_multiplier=1.0, secure_mode=mode), "DPFedAvg"),
        (
            lambda mode: DPFedBuff(noise_multiplier=1.0, clip_norm=1.0, secure_mode=mode, algorithm=FedBuff(buffer_size=2)),
            "DPFedBuff",
        ),
        (lambda mode: LocalDP(noise_multiplier=1.0, clip_norm=1.0, secure_mode=mode), "LocalDP"),
    ],
)
def test_research_mode_warns_once_naming_the_option_and_secure_mode_does_not(build, owner):
    with pytest.warns(UserWarning, match=rf"{owner}\(secure_mode=False\) draws its noise.*from the run's seed") as record:
        build(False).setup(make_federation())
    assert len([w for w in record if "secure_mode" in str(w.message)]) == 1
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*secure_mode")
        build(True).setup(make_federation())


def test_secure_mode_must_be_a_bool():
    with pytest.raises(TypeError, match="`secure_mode` must be True or False, got 'yes'"):
        DPFedAvg(noise_multiplier=1.0, secure_mode="yes")  # type: ignore[arg-type]
