"""Issue 15 item 3: a finite but huge update cannot poison the global model, and update norms can be bounded."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fl_lightning import (
    CompressedFedAvg,
    FedAvg,
    FedBuff,
    FederatedTrainer,
    FedPM,
    FedSoft,
    MedianNormFilter,
    NormClip,
    ServerAdam,
)
from fl_lightning.utils.init_args import flat_hparams
from fl_lightning.cli import FederatedCLI
from fl_lightning.compression import TopKCodec
from fl_lightning.loops.guards import nested_finite
from fl_lightning.participation import ConstantDelay
from fl_lightning.robust.update_bounds import update_norm

from ..algorithms.quadratic import Quadratic, quadratic_data, quadratic_trainer
from ..distributed.ddp_run import fit
from ..distributed.test_ddp_equivalence import TOLERANCE, finished, max_diff, result
from .aggregate_helpers import Poison, RoundRecorder, finite, same, tiny_data, tiny_model, tiny_trainer

# Δ = 1e37 on a client of 40 samples: the float32 weighted sum (40 · 1e37) overflows to Inf.
HUGE = 1e37
pytestmark = pytest.mark.filterwarnings("ignore:.*the round is rolled back")


def test_fedavg_round_with_an_overflowing_update_is_rolled_back_and_the_run_recovers():
    recorder = RoundRecorder()
    model = tiny_model()
    trainer = tiny_trainer(max_epochs=3, callbacks=[recorder, Poison({1}, HUGE, limit=1)])
    with pytest.warns(UserWarning, match="Round 0: FedAvg.s aggregate is not finite"):
        trainer.fit(model, datamodule=tiny_data())

    assert finite(model)
    assert [m["round/rolled_back"] for m in recorder.metrics] == [1.0, 0.0, 0.0]
    assert same(recorder.before[0], recorder.after[0])  # round 0 left the model as it was
    assert not same(recorder.before[1], recorder.after[1])  # later rounds train: nobody is dropped against Inf
    assert [m["round/dropped_clients"] for m in recorder.metrics] == [0.0, 0.0, 0.0]


def test_fedadam_rollback_restores_the_server_optimizer_moments():
    # FedAdam's global step stays finite (m / sqrt(v = Inf) = 0) but v overflows: the state is checked too.
    optimizer = ServerAdam(lr=0.05)
    states: list[dict] = []

    class ServerState(RoundRecorder):
        def on_round_aggregated(self, trainer, pl_module, round_idx, metrics):
            super().on_round_aggregated(trainer, pl_module, round_idx, metrics)
            states.append(optimizer.state_dict())

    recorder = ServerState()
    model = tiny_model()
    poison = Poison({2}, HUGE, limit=1)
    trainer = tiny_trainer(max_epochs=2, algorithm=FedAvg(server_optimizer=optimizer), callbacks=[recorder, poison])
    trainer.fit(model, datamodule=tiny_data())

    assert [m["round/rolled_back"] for m in recorder.metrics] == [1.0, 0.0]
    assert states[0] == {}  # the moments as before round 0: not yet created
    assert states[1]["m"] and nested_finite(states[1]) and finite(model)
    assert same(recorder.before[0], recorder.after[0])


def test_fedbuff_aggregation_with_an_overflowing_update_is_rolled_back():
    algorithm = FedBuff(buffer_size=2, delays=ConstantDelay(1.0), server_lr=3.0)
    influence: list[list[float]] = []

    class Influence(RoundRecorder):
        def on_round_aggregated(self, trainer, pl_module, round_idx, metrics):
            super().on_round_aggregated(trainer, pl_module, round_idx, metrics)
            influence.append(algorithm.influence.tolist())

    recorder = Influence()
    model = tiny_model()
    # The first buffer holds clients 0 and 1; α = 1/b = 1/2 and server_lr = 3: 3e38 · 3/2 overflows float32.
    trainer = tiny_trainer(max_epochs=3, algorithm=algorithm, callbacks=[recorder, Poison({0}, 3e38, limit=1)])
    trainer.fit(model, datamodule=tiny_data())

    assert [m["round/rolled_back"] for m in recorder.metrics] == [1.0, 0.0, 0.0] and finite(model)
    assert same(recorder.before[0], recorder.after[0])
    assert influence[0] == [0.0] * 4  # the discarded aggregation credited nobody
    assert influence[1] == [0.0, 0.0, 0.5, 0.5]


def test_norm_clip_is_exact():
    # Quadratic devices, 5 full-batch steps of lr 0.05 from w = 0: Δ_k = (1 - 0.95^5) c_k.
    factor = 1 - 0.95**5
    centres = torch.tensor([[0.0, 0.0], [4.0, 0.0], [0.0, 4.0], [4.0, 4.0]], dtype=torch.float64)
    model = Quadratic()
    quadratic_trainer(max_epochs=1, update_bound=NormClip(max_norm=0.5)).fit(model, datamodule=quadratic_data(centres))

    deltas = [factor * c for c in centres]
    clipped = [d * min(1.0, 0.5 / float(d.norm())) if d.norm() > 0 else d for d in deltas]
    assert all(float(d.norm()) == pytest.approx(0.5, abs=1e-15) for d in clipped[1:])
    torch.testing.assert_close(model.w.detach(), torch.stack(clipped).mean(dim=0), rtol=0, atol=1e-15)


FAR = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [100.0, 100.0]], dtype=torch.float64)


def test_median_filter_rejects_the_outlier_in_a_round():
    recorder = RoundRecorder()
    model = Quadratic()
    trainer = quadratic_trainer(max_epochs=1, update_bound=MedianNormFilter(factor=3.0), callbacks=[recorder])
    with pytest.warns(UserWarning, match="MedianNormFilter rejects client 3's update"):
        trainer.fit(model, datamodule=quadratic_data(FAR))

    factor = 1 - 0.95**5
    torch.testing.assert_close(model.w.detach(), factor * FAR[:3].mean(dim=0), rtol=0, atol=1e-15)
    metrics = recorder.metrics[0]
    assert (metrics["round/aggregated_clients"], metrics["round/rejected_clients"]) == (3.0, 1.0)


def test_median_filter_rejects_the_outlier_in_an_asynchronous_buffer():
    # Every client in flight with equal speeds: the first buffer holds the four first updates.
    recorder = RoundRecorder()
    model = Quadratic()
    algorithm = FedBuff(buffer_size=4, delays=ConstantDelay(1.0))
    bound = MedianNormFilter(factor=3.0)
    trainer = quadratic_trainer(max_epochs=1, algorithm=algorithm, update_bound=bound, callbacks=[recorder])
    with pytest.warns(UserWarning, match="MedianNormFilter rejects client 3's update"):
        trainer.fit(model, datamodule=quadratic_data(FAR))

    factor = 1 - 0.95**5
    # FedBuff's α = 1/b over the updates it aggregates: the three kept ones.
    torch.testing.assert_close(model.w.detach(), factor * FAR[:3].mean(dim=0), rtol=0, atol=1e-15)
    assert (recorder.metrics[0]["round/aggregated_clients"], recorder.metrics[0]["round/rejected_clients"]) == (3.0, 1.0)


def test_bound_applies_to_decoded_compressed_deltas():
    norms: list[float] = []

    class Spy(CompressedFedAvg):
        def aggregate_decoded(self, round_idx, global_state, updates):
            norms.extend(update_norm(u.payload) for u in updates)
            return super().aggregate_decoded(round_idx, global_state, updates)

    algorithm = Spy(codec=TopKCodec(density=0.5))
    trainer = tiny_trainer(max_epochs=1, algorithm=algorithm, update_bound=NormClip(max_norm=1e-3))
    trainer.fit(tiny_model(), datamodule=tiny_data())
    assert len(norms) == 4 and all(n == pytest.approx(1e-3, rel=1e-6) for n in norms)


def test_median_filter_under_two_processes_matches_one(tmp_path, two_process_runs):
    # The filter compares every rank's updates: their norms are gathered first. In these 2 rounds
    # it rejects one update in round 1. The 2-process fit is the session's (tests/distributed/runs.py).
    fit(tmp_path / "one", update_bound="median", rounds=2)
    one, two = result(tmp_path / "one"), result(finished(two_process_runs, "median-filter"))
    assert max_diff(one["global_state"], two["global_state"]) <= TOLERANCE
    for key in ("round/aggregated_clients", "round/rejected_clients", "round/dropped_clients"):
        assert two["metrics"][key] == one["metrics"][key], key
    assert one["metrics"]["round/rejected_clients"] == 1.0


@pytest.mark.parametrize("algorithm", [FedSoft(), FedPM()], ids=["fedsoft", "fedpm"])
def test_algorithms_without_delta_uploads_refuse_a_bound(algorithm):
    trainer = tiny_trainer(max_epochs=1, algorithm=algorithm, update_bound=NormClip(max_norm=1.0))
    with pytest.raises(ValueError, match=f"{type(algorithm).__name__}'s uploads are not deltas"):
        trainer.fit(tiny_model(), datamodule=tiny_data())


@pytest.mark.parametrize(
    ("make", "error", "match"),
    [
        (lambda: NormClip(max_norm=0.0), ValueError, r"`max_norm` must be a finite number > 0.0, got 0.0"),
        (lambda: NormClip(max_norm=float("inf")), ValueError, "`max_norm` must be a finite number"),
        (lambda: NormClip(max_norm="1"), TypeError, "`max_norm` must be a number, got '1'"),
        (lambda: MedianNormFilter(factor=0.5), ValueError, r"`factor` must be a finite number >= 1.0, got 0.5"),
        (lambda: FederatedTrainer(update_bound=3.0), TypeError, "`update_bound` must be an fl_lightning.robust.update_bounds.Upd"),
    ],
)
def test_bad_bounds_are_refused(make, error, match):
    with pytest.raises(error, match=match):
        make()


def test_update_bound_is_selectable_from_yaml(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    quickstart = Path(__file__).resolve().parents[2] / "configs" / "quickstart.yaml"
    bound = "--trainer.update_bound=fl_lightning.MedianNormFilter"
    cli = FederatedCLI(args=["--config", str(quickstart), bound, "--trainer.update_bound.factor=2.5"], run=False)
    assert isinstance(cli.trainer.fit_loop.update_bound, MedianNormFilter)
    assert cli.trainer.fit_loop.update_bound.factor == 2.5


def test_bounds_are_configurable_and_fingerprinted():
    expected = {"update_bound": "MedianNormFilter", "update_bound.factor": 2.0}
    assert flat_hparams("update_bound", MedianNormFilter(factor=2.0)) == expected
    assert NormClip(max_norm=3).scales([0.0, 1.5, 6.0]) == [1.0, 1.0, 0.5]
    assert MedianNormFilter(factor=2.0).scales([0.0, 1.0, 2.0, 3.0, 10.0]) == [1.0, 1.0, 1.0, 1.0, None]


def test_an_aggregate_with_a_negative_running_variance_is_rolled_back_naming_the_algorithm():
    """Issue 39 item 4: a finite aggregate whose BatchNorm running variance is negative is not a valid model."""
    from .algorithm_cases import BatchNormLogisticRegression

    recorder = RoundRecorder()
    torch.manual_seed(0)
    model = BatchNormLogisticRegression()
    # Every float of client 1's first delta is -100: finite, but running_var = 1 + (-100) / 4 < 0.
    trainer = tiny_trainer(max_epochs=2, callbacks=[recorder, Poison({1}, -100.0, limit=1)])
    with pytest.warns(UserWarning, match=r"Round 0: FedAvg's aggregate has a negative BatchNorm running variance \(net.0.running_var\)"):
        trainer.fit(model, datamodule=tiny_data())
    assert [m["round/rolled_back"] for m in recorder.metrics] == [1.0, 0.0]
    assert same(recorder.before[0], recorder.after[0])
    assert (model.net[0].running_var > 0).all()
