"""Central DP over FedMRN's decoded masked-noise updates; what DP refuses to compose with, and why."""

from __future__ import annotations

import numpy as np
import pytest

from fl_lightning import DPFedAvg, FedMRN, FedPM, FedSoft
from fl_lightning.privacy import LocalDP
from tests.algorithms.fedmrn_fixtures import digits, tiny, trainer
from tests.privacy import reference

CLIP = 0.05
CLIENTS, PER_ROUND = 6, 4


def _dp_fedmrn_round(noise_multiplier: float):
    """One round of DPFedAvg over FedMRN: the decoded updates, the global delta and the logged metrics."""
    algorithm = DPFedAvg(noise_multiplier=noise_multiplier, clip_norm=CLIP, delta=1e-3, algorithm=FedMRN(alpha=0.05))
    decoded = []
    decode = algorithm.inner.decode_update
    algorithm.inner.decode_update = lambda update: decoded.append(decode(update)) or decoded[-1]  # type: ignore[method-assign]
    model = tiny()
    names = [n for n, t in model.state_dict().items() if t.is_floating_point()]
    before = np.concatenate([model.state_dict()[n].double().reshape(-1).numpy() for n in names])
    run = trainer(max_epochs=1, clients_per_round=PER_ROUND, local_steps=3, algorithm=algorithm)
    run.fit(model, datamodule=digits(num_clients=CLIENTS))
    after = np.concatenate([model.state_dict()[n].double().reshape(-1).numpy() for n in names])
    rows = np.stack([np.concatenate([u.payload[n].double().reshape(-1).numpy() for n in names]) for u in decoded])
    return rows, after - before, {k: float(v) for k, v in run.callback_metrics.items()}


def test_each_decoded_mask_update_is_clipped_and_the_sum_is_divided_by_m():
    rows, delta, _ = _dp_fedmrn_round(noise_multiplier=0.0)
    norms = np.linalg.norm(rows, axis=1)
    assert len(rows) == PER_ROUND and (norms > CLIP).all()  # every update is clipped: the test sees the clipping
    clipped = rows * np.minimum(1.0, CLIP / norms)[:, None]
    np.testing.assert_allclose(delta, clipped.sum(axis=0) / PER_ROUND, rtol=1e-5, atol=1e-8)


def test_the_noise_on_the_sum_has_std_z_c_and_epsilon_is_never_below_dp_accountings():
    z = 2.0
    rows, delta, metrics = _dp_fedmrn_round(noise_multiplier=z)
    clipped = rows * np.minimum(1.0, CLIP / np.linalg.norm(rows, axis=1))[:, None]
    noise = delta * PER_ROUND - clipped.sum(axis=0)
    # 1,184 draws: the sample std's relative standard error is 1/sqrt(2n) = 2.1 %; 10 % is 4.9 of those.
    assert noise.std() == pytest.approx(z * CLIP, rel=0.1)
    assert metrics["round/dp_noise_std"] == pytest.approx(z * CLIP)
    # Replace-one: one client's decoded update swapped moves the clipped sum by up to 2C (std zC).
    assert metrics["round/dp_epsilon"] >= reference.fixed_size_pld(PER_ROUND / CLIENTS, z, 1, 1e-3, pessimistic=False)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: DPFedAvg(noise_multiplier=1.0, algorithm=FedSoft(num_clusters=2)), "FedSoft's uploads are not deltas.*importance"),
        (lambda: DPFedAvg(noise_multiplier=1.0, algorithm=FedPM()), "FedPM's uploads are not deltas"),
        (lambda: LocalDP(noise_multiplier=1.0, clip_norm=1.0, algorithm=FedMRN()), "FedMRN uploads something else .*masks"),
    ],
    ids=["dp-fedsoft", "dp-fedpm", "local-dp-fedmrn"],
)
def test_compositions_without_a_meaningful_guarantee_are_refused_with_the_reason(build, message):
    with pytest.raises(ValueError, match=message):
        build()
