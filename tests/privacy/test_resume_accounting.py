"""ε across a resume composes what was released (issue 24 item 3), and tampered privacy state is refused on
load with a ValueError naming the entry (issue 25 item 5), which the loop turns into one CheckpointError."""

from __future__ import annotations

import copy
import math

import dp_accounting as dp
import pytest
import torch

from fl_lightning import DPFedAvg, FedBuff
from fl_lightning.checkpointing.checkpoint_io import CheckpointError
from fl_lightning.privacy import DPFedBuff, LocalDP
from tests.algorithms.quadratic import CENTRES, Quadratic, quadratic_data, quadratic_trainer
from tests.privacy import reference
from tests.privacy.conftest import global_state, make_federation, updates_with_norms


def _rounds(algorithm, rounds, first=0):
    """Runs ``rounds`` aggregations of two updates; returns the last metrics."""
    state = global_state(algorithm.federation)
    for round_idx in range(first, first + rounds):
        metrics = algorithm.aggregate(round_idx, state, updates_with_norms(state, [0.5, 2.0], seed=round_idx))
    return metrics


def _resumed(build, z_before, z_after, rounds_before):
    """An algorithm built with ``z_before`` after ``rounds_before`` rounds, and one built with ``z_after`` loaded
    from its state; returns both algorithms and the ε logged before the resume."""
    first = build(z_before)
    first.setup(make_federation(clients_per_round=2))
    before = _rounds(first, rounds_before)
    second = build(z_after)
    second.setup(make_federation(clients_per_round=2))
    second.load_state_dict(copy.deepcopy(first.state_dict()))
    return first, second, before


def test_dp_fedavg_resumed_with_more_noise_keeps_the_rounds_spent_at_the_old_noise():
    """The audit's case: z 0.5 for 5 rounds, then 2.0. Recomputing all 6 rounds at z = 2 made ε fall from
    13.9 to 1.7; the composition of both settings is at least dp-accounting's for the rounds really run."""
    _, resumed, before = _resumed(lambda z: DPFedAvg(noise_multiplier=z, clip_norm=1.0, accounting="rdp"), 0.5, 2.0, 5)
    after = _rounds(resumed, 1, first=5)["dp_epsilon"]

    def sampled(z: float) -> dp.DpEvent:  # replace-one: std zC over a 2C shift
        return dp.SampledWithoutReplacementDpEvent(4, 2, dp.GaussianDpEvent(z / 2))

    released = dp.ComposedDpEvent([dp.SelfComposedDpEvent(sampled(0.5), 5), sampled(2.0)])
    assert after >= reference.rdp(released, reference.REPLACE, 1e-5) * (1 - 1e-12)
    assert after > before["dp_epsilon"] > 10  # it never goes backwards
    assert resumed.rounds_spent == 6


def test_the_budget_check_after_a_resume_counts_the_old_rounds():
    first = DPFedAvg(noise_multiplier=0.5, clip_norm=1.0)
    first.setup(make_federation(clients_per_round=2))
    spent = _rounds(first, 3)["dp_epsilon"]
    resumed = DPFedAvg(noise_multiplier=5.0, clip_norm=1.0, target_epsilon=spent * 0.99)
    resumed.setup(make_federation(clients_per_round=2))
    assert resumed.accountant.epsilon(4) < spent * 0.5  # 4 rounds all at z = 5 would be well within the budget
    resumed.load_state_dict(copy.deepcopy(first.state_dict()))
    assert not resumed.budget_left and resumed.select_clients(3) == []


def test_dp_fedbuff_and_local_dp_resumed_with_other_noise_compose_both():
    fedbuff = lambda z: DPFedBuff(noise_multiplier=z, clip_norm=1.0, algorithm=FedBuff(buffer_size=2))  # noqa: E731
    _, resumed, before = _resumed(fedbuff, 0.8, 3.0, 4)
    after = _rounds(resumed, 1, first=4)["dp_epsilon"]
    gaussians = dp.ComposedDpEvent([dp.SelfComposedDpEvent(dp.GaussianDpEvent(0.8), 4), dp.GaussianDpEvent(3.0)])
    assert after >= reference.rdp(gaussians, reference.ADD_OR_REMOVE, 1e-5) * (1 - 1e-12) and after > before["dp_epsilon"]

    local = lambda z: LocalDP(noise_multiplier=z, clip_norm=1.0)  # noqa: E731
    _, resumed, before = _resumed(local, 1.0, 4.0, 4)
    after = _rounds(resumed, 1, first=4)["local_dp_epsilon"]
    halves = dp.ComposedDpEvent([dp.SelfComposedDpEvent(dp.GaussianDpEvent(0.5), 4), dp.GaussianDpEvent(2.0)])
    assert after >= reference.rdp(halves, reference.ADD_OR_REMOVE, 1e-5) * (1 - 1e-12) and after > before["local_dp_epsilon"]


def _tampered(build, z=1.0):
    algorithm = build(z)
    algorithm.setup(make_federation(clients_per_round=2))
    _rounds(algorithm, 2)
    return algorithm, copy.deepcopy(algorithm.state_dict())


@pytest.mark.parametrize(
    ("entry", "value", "message"),
    [
        ("clip_norm", math.nan, "`clip_norm` must be a number > 0"),
        ("clip_norm", -1.0, "`clip_norm` must be a number > 0"),
        ("clip_norm", math.inf, "`clip_norm` must be finite when noise is added"),
        ("spent", [[[1.0, 4.0, 2.0], -2]], "`spent` must be a list"),
        ("spent", [[[math.nan, 4.0, 2.0], 2]], "`spent` must be a list"),
        ("spent", [[[-1.0, 4.0, 2.0], 2]], "`spent` must be a list"),
        ("spent", "2", "`spent` must be a list"),
        ("sampling", "poisson", "`sampling` was 'poisson' and is now 'fixed'"),
    ],
)
def test_tampered_dp_fedavg_state_is_refused_naming_the_entry(entry, value, message):
    algorithm, state = _tampered(lambda z: DPFedAvg(noise_multiplier=z, clip_norm=1.0))
    with pytest.raises(ValueError, match=message):
        algorithm.load_state_dict({**state, entry: value})


def test_an_older_checkpoint_s_round_count_is_checked_and_accounted_at_the_current_setting():
    algorithm, state = _tampered(lambda z: DPFedAvg(noise_multiplier=z, clip_norm=1.0))
    older = {k: v for k, v in state.items() if k not in ("spent", "sampling")}
    for bad in (-1, 2.5, True):
        with pytest.raises(ValueError, match="`rounds_spent` must be an integer >= 0"):
            algorithm.load_state_dict({**older, "rounds_spent": bad})
    algorithm.load_state_dict({**older, "rounds_spent": 2})
    assert algorithm.rounds_spent == 2


def _dp_fedbuff(z: float) -> DPFedBuff:
    return DPFedBuff(noise_multiplier=z, clip_norm=1.0, algorithm=FedBuff(buffer_size=2))


def _local_dp(z: float) -> LocalDP:
    return LocalDP(noise_multiplier=z, clip_norm=1.0)


@pytest.mark.parametrize(
    ("build", "entry", "value", "message"),
    [
        (_dp_fedbuff, "spent", [[[1.0], -1]], "spent"),
        (_dp_fedbuff, "spent", [[[1.0, 2.0], 1]], "spent"),
        (_local_dp, "spent", [[[math.inf], 1]], "spent"),
        (_local_dp, "uploads", {0: -3}, r"uploads\[0\]"),
    ],
    ids=["dp-fedbuff-negative", "dp-fedbuff-width", "local-dp-inf", "local-dp-uploads"],
)
def test_tampered_dp_fedbuff_and_local_dp_state_is_refused_naming_the_entry(build, entry, value, message):
    algorithm, state = _tampered(build)
    with pytest.raises(ValueError, match=message):
        algorithm.load_state_dict({**state, entry: value})


def test_a_tampered_checkpoint_is_one_checkpoint_error_naming_the_file(tmp_path):
    """Through the loop: a DP ledger reset to a negative count is refused on resume, naming the file and the entry."""
    def run(max_epochs, ckpt_path=None):
        trainer = quadratic_trainer(max_epochs=max_epochs, algorithm=DPFedAvg(noise_multiplier=1.0, clip_norm=1.0), local_steps=1)
        trainer.fit(Quadratic(), datamodule=quadratic_data(CENTRES), ckpt_path=ckpt_path)
        return trainer

    run(2).save_checkpoint(tmp_path / "dp.ckpt")
    state = torch.load(tmp_path / "dp.ckpt", weights_only=False)
    state["loops"]["fit_loop"]["state_dict"]["federated"]["algorithm"]["spent"] = [[[1.0, 4.0, 4.0], -2]]
    torch.save(state, tmp_path / "tampered.ckpt")
    with pytest.raises(CheckpointError, match=r"tampered\.ckpt: DPFedAvg cannot load .*`spent` must be a list"):
        run(3, ckpt_path=tmp_path / "tampered.ckpt")
