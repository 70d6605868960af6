"""DP in asynchronous runs: DPFedBuff (one clipped update per client, the noise's std, ε of composed
Gaussians) and LocalDP (ε of the most uploads of any client)."""

from __future__ import annotations

from dataclasses import replace

import dp_accounting as dp
import numpy as np
import pytest
import torch

from fl_lightning import FedAsync, FedAvg, FedBuff, FedStaleWeight
from fl_lightning.participation.speed import ConstantDelay
from fl_lightning.privacy import DPFedBuff, LocalDP
from tests.algorithms.quadratic import CENTRES, Quadratic, quadratic_data, quadratic_trainer
from tests.privacy.conftest import global_state, make_federation, updates_with_norms

B = 4


def _flat(state) -> np.ndarray:
    return np.concatenate([t.double().reshape(-1).numpy() for t in state.values() if t.is_floating_point()])


def _aggregate(algorithm, updates, version=0):
    federation = make_federation()
    algorithm.setup(federation)
    before = global_state(federation)
    after = {k: v.clone() for k, v in before.items()}
    metrics = algorithm.aggregate(version, after, updates)
    return _flat(after) - _flat(before), after, before, metrics


def test_each_client_counts_once_clipped_and_the_sum_is_divided_by_the_buffer_size():
    updates = updates_with_norms(global_state(make_federation()), [0.5, 3.0, 10.0, 1.0])
    updates[3] = replace(updates[3], client_id=0)  # client 0 arrived twice in the buffer: its second update is dropped
    updates = [replace(u, staleness=s) for u, s in zip(updates, [0, 2, 1, 0])]
    algorithm = DPFedBuff(noise_multiplier=0.0, clip_norm=2.0, algorithm=FedBuff(buffer_size=B, server_lr=0.5, staleness_discount="inverse"))
    step, after, before, metrics = _aggregate(algorithm, updates)

    kept = updates[:3]
    alpha = [1.0 / (1.0 + u.staleness) / 3 for u in kept]  # FedBuff's weights over the kept updates
    clipped = sum(_flat(u.payload) * min(1.0, 2.0 / n) for u, n in zip(kept, [0.5, 3.0, 10.0]))
    np.testing.assert_allclose(step, 0.5 * sum(alpha) * clipped / B, rtol=1e-5, atol=1e-7)  # float32 steps of weights near 1
    assert after["bn.num_batches_tracked"] == before["bn.num_batches_tracked"]  # counters are not released
    assert metrics["dp_repeats_dropped"] == 1.0 and metrics["dp_noise_std"] == 0.0


def _epsilon(noise_multiplier: float, aggregations: int, delta: float) -> float:
    """dp-accounting's own ε for ``aggregations`` composed Gaussian mechanisms, no sampling."""
    accountant = dp.rdp.RdpAccountant()
    accountant.compose(dp.SelfComposedDpEvent(dp.GaussianDpEvent(noise_multiplier), aggregations))
    return accountant.get_epsilon(delta)


def test_the_buffer_noise_has_std_z_c_and_epsilon_composes_gaussians_without_sampling():
    zeros = updates_with_norms(global_state(make_federation()), [0.0] * B)
    algorithm = DPFedBuff(noise_multiplier=1.5, clip_norm=2.0, delta=1e-5, algorithm=FedBuff(buffer_size=B))
    step, *_ = _aggregate(algorithm, zeros)
    noise = step * B  # FedBuff's constant weights sum to 1; the server divides the noised sum by b
    # 100 104 draws: the sample std's relative standard error is 0.22 %; 1 % is 4.5 of those.
    assert noise.std() == pytest.approx(3.0, rel=0.01)
    state = global_state(algorithm.federation)
    for version in (1, 2):
        metrics = algorithm.aggregate(version, state, zeros)
    assert metrics["dp_epsilon"] == pytest.approx(_epsilon(1.5, 3, 1e-5), rel=1e-9)


def test_a_fast_client_s_repeats_are_dropped_in_a_fit_and_epsilon_is_logged():
    # Client 0 takes 1 virtual second, the others 10: the first buffers hold client 0 three times.
    fsw = FedStaleWeight(buffer_size=3, delays=ConstantDelay([1.0, 10.0, 10.0, 10.0]))
    trainer = quadratic_trainer(max_epochs=2, algorithm=DPFedBuff(noise_multiplier=1.0, clip_norm=1.0, log_client_statistics=True, algorithm=fsw), local_steps=1)
    trainer.fit(Quadratic(), datamodule=quadratic_data(CENTRES))
    metrics = trainer.callback_metrics
    assert metrics["round/dp_repeats_dropped"] == 2.0 and metrics["round/aggregated_clients"] == 3.0
    assert float(metrics["round/dp_epsilon"]) == pytest.approx(_epsilon(1.0, 2, 1e-5), rel=1e-6)


def test_an_async_fit_stops_at_the_budget_and_a_resumed_run_releases_nothing_more(tmp_path):
    budget = float(_epsilon(1.0, 2, 1e-5) + _epsilon(1.0, 3, 1e-5)) / 2

    def run(ckpt_path=None):
        algorithm = DPFedBuff(
            noise_multiplier=1.0, clip_norm=1.0, target_epsilon=budget, algorithm=FedBuff(buffer_size=2, delays=ConstantDelay(1.0))
        )
        trainer = quadratic_trainer(max_epochs=10, algorithm=algorithm, local_steps=1)
        model = Quadratic()
        trainer.fit(model, datamodule=quadratic_data(CENTRES), ckpt_path=ckpt_path)
        return trainer, model

    with pytest.warns(UserWarning, match="one more would exceed target_epsilon"):
        trainer, model = run()
    assert len(trainer.fit_loop.history) == 2
    assert float(trainer.callback_metrics["round/dp_epsilon"]) == pytest.approx(_epsilon(1.0, 2, 1e-5), rel=1e-6)
    trainer.save_checkpoint(tmp_path / "spent.ckpt")

    resumed, resumed_model = run(ckpt_path=tmp_path / "spent.ckpt")
    assert len(resumed.fit_loop.history) == 2  # no third aggregation: epsilon would pass the budget
    for before, after in zip(model.parameters(), resumed_model.parameters(), strict=True):
        assert torch.equal(before, after)


def test_local_dp_in_an_async_run_accounts_the_most_uploads_of_any_client():
    fedbuff = FedBuff(buffer_size=3, delays=ConstantDelay([1.0, 10.0, 10.0, 10.0]))
    algorithm = LocalDP(noise_multiplier=2.0, clip_norm=1.0, delta=1e-5, algorithm=fedbuff)
    trainer = quadratic_trainer(max_epochs=3, algorithm=algorithm, local_steps=1)
    trainer.fit(Quadratic(), datamodule=quadratic_data(CENTRES))
    assert algorithm.uploads == {0: 9}  # client 0 arrives at t = 1, ..., 9: three buffers; the others at t = 10
    assert float(trainer.callback_metrics["round/local_dp_epsilon"]) == pytest.approx(_epsilon(1.0, 9, 1e-5), rel=1e-6)  # z/2


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"algorithm": FedAvg()}, ValueError, "wraps FedBuff or FedStaleWeight, got FedAvg"),
        ({"algorithm": FedAsync()}, ValueError, "got FedAsync"),
        ({"noise_multiplier": -1.0}, ValueError, "noise_multiplier"),
        ({"clip_norm": 0.0}, ValueError, "clip_norm"),
        ({"delta": 1.0}, ValueError, "delta"),
        ({"target_epsilon": 0.0}, ValueError, "target_epsilon"),
        ({"target_epsilon": 0.01}, ValueError, "One aggregation already spends epsilon=.* > target_epsilon=0.01"),
    ],
)
def test_bad_input_is_named(kwargs, error, message):
    with pytest.raises(error, match=message):
        DPFedBuff(**{"noise_multiplier": 1.0, "clip_norm": 1.0, "algorithm": FedBuff(buffer_size=2), **kwargs})
