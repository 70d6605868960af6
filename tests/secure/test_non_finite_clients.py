"""SecureAggregation and a non-finite client: dropped and counted as plain FedAvg drops it, never aggregated as 0,
never stopping the fit (issue 38, item 6)."""

from __future__ import annotations

import math

import pytest
import torch

from fl_lightning import FedAvg
from fl_lightning.algorithms import ClientContext
from fl_lightning.loops.guards import decode_and_screen
from fl_lightning.secure import SecureAggregation
from fl_lightning.secure.masking import encode
from fl_lightning.secure.secure_aggregation import WITHHELD
from tests.algorithms.quadratic import CENTRES, Quadratic, quadratic_data, quadratic_trainer
from tests.algorithms.test_fedavg import NUM_SAMPLES, _global_state, _updates, federation  # noqa: F401 (fixture)
from tests.recording_logger import RecordingLogger


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf], ids=["nan", "inf", "minus_inf"])
def test_a_non_finite_client_is_dropped_and_its_pads_recovered(federation, bad):  # noqa: F811
    updates = _updates(_global_state(federation.module), seed=3)
    poisoned = {n: (torch.full_like(t, bad) if t.is_floating_point() else t) for n, t in updates[1].payload.items()}
    algorithm = SecureAggregation()
    algorithm.setup(federation)
    clients = algorithm.select_clients(0)
    uploads = []
    for update in updates:
        context = ClientContext(round_idx=0, client_id=update.client_id, num_samples=update.num_samples, num_epochs=1, num_steps=None, seed=0)
        uploads.append(algorithm.client_update(context, federation.module, poisoned if update is updates[1] else update.payload))
    assert set(uploads[1].payload) == {WITHHELD}
    with pytest.warns(UserWarning, match=f"client {updates[1].client_id} sent a non-finite update"):
        screened = decode_and_screen(algorithm, 0, [u for u in uploads if u.client_id in clients])
    assert screened.dropped == [updates[1].client_id]
    state = _global_state(federation.module)
    metrics = algorithm.aggregate(0, state, screened.finite)
    plain = _global_state(federation.module)
    fedavg = FedAvg()
    fedavg.setup(federation)
    fedavg.aggregate(0, plain, [u for u in updates if u is not updates[1]])  # plain FedAvg without the dropped client
    for name, value in plain.items():
        assert (state[name].double() - value.double()).abs().max() <= 1e-5, name
    assert metrics["secagg_dropped_clients"] == 1.0


def test_fixed_point_refuses_non_finite_values():
    for bad in (math.nan, math.inf):
        with pytest.raises(ValueError, match="finite values only"):
            encode(torch.tensor([1.0, bad]), 48, 20)


def _fit(algorithm, centres):
    logger = RecordingLogger()
    trainer = quadratic_trainer(max_epochs=2, algorithm=algorithm, local_steps=1, logger=logger)
    model = Quadratic()
    trainer.fit(model, datamodule=quadratic_data(centres))
    rounds = [m for _, m in logger.records if "round/dropped_clients" in m]
    return model.w.detach().clone(), rounds


@pytest.mark.parametrize("bad", [math.nan, math.inf], ids=["nan", "inf"])
def test_a_fit_with_a_non_finite_client_runs_and_drops_it_as_plain_fedavg_does(bad):
    centres = CENTRES.clone()
    centres[1] = bad
    with pytest.warns(UserWarning, match="client 1 sent a non-finite update"):
        secure_w, secure_rounds = _fit(SecureAggregation(), centres)
        plain_w, plain_rounds = _fit(FedAvg(), centres)
    for rounds in (secure_rounds, plain_rounds):
        assert [(r["round/aggregated_clients"], r["round/dropped_clients"]) for r in rounds] == [(3.0, 1.0)] * 2
    assert torch.isfinite(secure_w).all()
    torch.testing.assert_close(secure_w, plain_w, atol=1e-5, rtol=0)
