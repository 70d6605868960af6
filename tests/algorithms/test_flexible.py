"""FlexibleParticipation (Ruan et al. 2021): schemes A/B/C, incomplete work, objective shifts."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from fl_lightning.algorithms.flexible import FlexibleParticipation, scheme_coefficients
from fl_lightning.participation import FixedSteps
from fl_lightning.participation.events import Arrival, Departure, ObjectiveSchedule, should_exclude
from fl_lightning.models.schedulers import StaircaseLR

from .quadratic import CENTRES, Quadratic, quadratic_data, quadratic_trainer

E, LR = 5, 0.05
STEPS = [3, 4, 5, 5]


# --- coefficients (paper §4.1, Fig. 1) -------------------------------------------------------


def test_coefficients_of_the_three_schemes():
    p = [0.25] * 4
    assert scheme_coefficients("C", STEPS, p, E, 4) == pytest.approx([5 / 3 / 4, 5 / 4 / 4, 0.25, 0.25])
    assert scheme_coefficients("A", STEPS, p, E, 4) == pytest.approx([0, 0, 0.5, 0.5])
    assert scheme_coefficients("B", STEPS, p, E, 4) == pytest.approx(p)
    assert scheme_coefficients("C", [0, 5], [0.5, 0.5], E, 2) == [0.0, 0.5]
    assert scheme_coefficients("A", [1, 2], [0.5, 0.5], E, 2) == [0.0, 0.0]


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (("D", [1], [1.0], 5, 1), "`scheme` must be 'A', 'B' or 'C', got 'D'"),
        (("C", [1], [1.0], 0, 1), "requested local steps E must be >= 1, got 0"),
        (("C", [6], [1.0], 5, 1), r"Completed steps must be in 0..5, got \[6\]"),
    ],
)
def test_coefficient_bad_input(args, match):
    with pytest.raises(ValueError, match=match):
        scheme_coefficients(*args)


def test_scheme_c_is_exactly_unbiased_for_linear_losses():
    # F_k(w) = g_k . w with GD: Delta_k = -lr * s_k * g_k; scheme C's update equals the
    # full-participation FedAvg step -lr * E * sum_k p_k g_k for any s_k >= 1.
    rng = np.random.default_rng(0)
    g = rng.normal(size=(4, 3))
    p = np.array([0.1, 0.2, 0.3, 0.4])
    for steps in ([1, 2, 3, 4], [5, 5, 1, 2], [3, 3, 3, 3]):
        deltas = [-LR * s * g_k for s, g_k in zip(steps, g)]
        coef = scheme_coefficients("C", steps, p.tolist(), E, 4)
        update = sum(c * d for c, d in zip(coef, deltas))
        np.testing.assert_allclose(update, -LR * E * (p[:, None] * g).sum(axis=0), rtol=1e-12)
        coef_b = scheme_coefficients("B", steps, p.tolist(), E, 4)
        assert not np.allclose(sum(c * d for c, d in zip(coef_b, deltas)), update)


# --- the real federated loop on quadratics (notes §6.2 test 3) ------------------------------


def fixed_point(scheme: str, steps=STEPS) -> np.ndarray:
    p = [0.25] * 4
    a = np.array(scheme_coefficients(scheme, steps, p, E, 4)) * (1 - (1 - LR) ** np.array(steps))
    return (a[:, None] * CENTRES.numpy()).sum(axis=0) / a.sum()


def run_quadratic(scheme: str, rounds: int = 150, **kwargs) -> np.ndarray:
    model = Quadratic(lr=LR)
    algorithm = FlexibleParticipation(scheme=scheme, participation=FixedSteps(steps=STEPS), **kwargs)
    quadratic_trainer(max_epochs=rounds, algorithm=algorithm).fit(model, datamodule=quadratic_data())
    return model.w.detach().numpy()


def test_quadratic_fixed_points_through_the_loop():
    w_star = CENTRES.mean(dim=0).numpy()
    w_c, w_b, w_a = run_quadratic("C"), run_quadratic("B"), run_quadratic("A")
    np.testing.assert_allclose(w_c, fixed_point("C"), atol=1e-6)
    assert np.linalg.norm(w_c - w_star) < 0.05
    assert np.linalg.norm(w_b - w_star) > 0.2
    np.testing.assert_allclose(w_b, fixed_point("B"), atol=1e-6)
    np.testing.assert_allclose(w_a, CENTRES[2:].mean(dim=0).numpy(), atol=1e-6)  # the always-complete devices


def test_incomplete_device_runs_exactly_its_steps():
    model = Quadratic(lr=LR)
    algorithm = FlexibleParticipation(participation=FixedSteps(steps=[3, 0, 0, 0]))
    trainer = quadratic_trainer(max_epochs=1, algorithm=algorithm)
    trainer.fit(model, datamodule=quadratic_data())
    assert model.optimizer_steps == 3 and model.forward_calls == 3  # s = 0: no forward pass at all
    assert trainer.callback_metrics["round/inactive_clients"] == 3


def test_scheme_a_round_without_complete_device_is_discarded():
    model = Quadratic(lr=LR)
    algorithm = FlexibleParticipation(scheme="A", participation=FixedSteps(steps=[1, 2, 3, 4]))
    trainer = quadratic_trainer(max_epochs=2, algorithm=algorithm)
    trainer.fit(model, datamodule=quadratic_data())
    assert torch.equal(model.w.detach(), torch.zeros(2, dtype=torch.float64))
    assert trainer.callback_metrics["round/discarded"] == 1
    assert trainer.current_epoch == 2


def test_clients_per_round_is_overridden_with_one_warning_naming_it():
    # The quadratic federation has 4 devices; all present ones train whatever clients_per_round says.
    model = Quadratic(lr=LR)
    trainer = quadratic_trainer(max_epochs=2, algorithm=FlexibleParticipation(), clients_per_round=2)
    message = r"overrides the trainer's `clients_per_round`: .* not clients_per_round=2 of 4"
    with pytest.warns(UserWarning, match=message) as caught:
        trainer.fit(model, datamodule=quadratic_data())
    assert sum("clients_per_round" in str(w.message) for w in caught) == 1
    assert [len(round_) for round_ in trainer.fit_loop.history] == [4, 4]


def test_needs_local_steps():
    trainer = quadratic_trainer(max_epochs=1, algorithm=FlexibleParticipation(), local_steps=None, local_epochs=1)
    with pytest.raises(ValueError, match="set the trainer's `local_steps`"):
        trainer.fit(Quadratic(), datamodule=quadratic_data())


# --- arrivals and departures -----------------------------------------------------------------


def test_objective_schedule():
    schedule = ObjectiveSchedule(
        num_clients=4,
        arrivals=[Arrival(client=3, round=5)],
        departures=[Departure(client=0, round=3, policy="include"), Departure(client=1, round=4, policy="exclude")],
    )
    assert schedule.members(0) == [0, 1, 2] and schedule.present(0) == [0, 1, 2]
    assert schedule.members(3) == [0, 1, 2] and schedule.present(3) == [1, 2]  # include: stays, inactive
    assert schedule.members(4) == [0, 2] and schedule.present(4) == [2]
    assert schedule.members(5) == [0, 2, 3] and schedule.present(5) == [2, 3]
    assert [schedule.shift_round(r) for r in range(7)] == [0, 0, 0, 0, 4, 5, 5]


def test_weights_sum_to_one_over_the_new_objective_and_boost_decays():
    data = quadratic_data()
    algorithm = FlexibleParticipation(arrivals=[Arrival(client=3, round=2)], fast_reboot=True)
    trainer = quadratic_trainer(max_epochs=1, algorithm=algorithm)
    trainer.fit(Quadratic(), datamodule=data)
    assert set(algorithm.weights(1)) == {0, 1, 2} and sum(algorithm.weights(1).values()) == pytest.approx(1)
    assert set(algorithm.weights(2)) == {0, 1, 2, 3} and sum(algorithm.weights(2).values()) == pytest.approx(1)
    assert [algorithm.boost(3, r) for r in (2, 3, 4)] == pytest.approx([3.0, 1.5, 1 + 2 / 9])
    assert algorithm.boost(0, 2) == 1.0
    assert algorithm.boost(3, 1000) == pytest.approx(1.0, abs=1e-5)


def test_learning_rate_restarts_at_the_arrival():
    lrs = []

    class Recorder(Quadratic):
        def on_train_epoch_start(self):
            lrs.append(self.trainer.optimizers[0].param_groups[0]["lr"])

    algorithm = FlexibleParticipation(arrivals=[Arrival(client=3, round=3)])
    trainer = quadratic_trainer(max_epochs=5, algorithm=algorithm)
    trainer.fit(Recorder(lr=1.0, lr_scheduler=StaircaseLR), datamodule=quadratic_data())
    # on_train_epoch_start runs before the arrival's restart in round 3; the client steps use eta0.
    assert lrs == pytest.approx([1.0, 1 / 2, 1 / 3, 1 / 4, 1 / 2])


@pytest.mark.parametrize(("restart", "after"), [(0.0, 1 / 5), (0.5, 1 / 3.5), (1.0, 1 / 2)])
def test_restart_share_sets_the_rate_after_the_arrival(restart, after):
    # Round 4 after an arrival at round 3: eta0 / (4 - s + 1) with the shift s moved restart x 3 rounds.
    lrs = []

    class Recorder(Quadratic):
        def on_train_epoch_start(self):
            lrs.append(self.trainer.optimizers[0].param_groups[0]["lr"])

    trainer = quadratic_trainer(max_epochs=5, algorithm=FlexibleParticipation(arrivals=[Arrival(client=3, round=3)]))
    trainer.fit(Recorder(lr=1.0, lr_scheduler=functools.partial(StaircaseLR, restart=restart)), datamodule=quadratic_data())
    assert lrs == pytest.approx([1.0, 1 / 2, 1 / 3, 1 / 4, after])


def test_restart_share_out_of_range():
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    with pytest.raises(ValueError, match=r"`restart` must be in \[0, 1\].*got 1.5"):
        StaircaseLR(optimizer, restart=1.5)


def test_evaluation_set_follows_the_objective():
    data = quadratic_data(holdout_fraction=0.2)
    algorithm = FlexibleParticipation(departures=[Departure(client=1, round=1, policy="exclude")])
    trainer = quadratic_trainer(max_epochs=2, algorithm=algorithm, limit_val_batches=1.0)
    model = Quadratic()
    model.validation_step = lambda batch, batch_idx: None
    trainer.fit(model, datamodule=data)
    assert data.evaluation_clients == [0, 2, 3]


def test_departure_decision_rule():
    # Heuristic: exclude iff T - tau0 >= c sqrt(Gamma * tau0).
    assert should_exclude(departure_round=10, total_rounds=200, local_steps=5, noniid=1.0)
    assert not should_exclude(departure_round=190, total_rounds=200, local_steps=5, noniid=1.0)
    assert not should_exclude(departure_round=100, total_rounds=110, local_steps=5, noniid=4.0)
    # Exact rule (Corollary 4.0.3): more remaining rounds make exclusion win; a larger Gamma_l delays it.
    constants = (1.0, 50.0, 10.0)
    crossing = lambda gamma: min(  # noqa: E731
        t for t in range(20, 10_000) if should_exclude(departure_round=20, total_rounds=t, local_steps=5, noniid=gamma, constants=constants)
    )
    assert crossing(0.5) < crossing(2.0)
    with pytest.raises(ValueError, match="Gamma_l must be >= 0"):
        should_exclude(departure_round=1, total_rounds=2, local_steps=1, noniid=-1.0)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"arrivals": [Arrival(client=9, round=1)]}, "unknown device: ids are 0..3"),
        ({"departures": [Departure(client=7, round=1)]}, "unknown device"),
        ({"departures": [Departure(client=1, round=2, policy="auto")]}, "'auto' policy needs `noniid`"),
        ({"departures": [Departure(client=1, round=2, policy="maybe")]}, "must be 'include', 'exclude' or 'auto'"),
        (
            {"arrivals": [Arrival(client=1, round=5)], "departures": [Departure(client=1, round=3)]},
            "is not after the device's arrival",
        ),
    ],
)
def test_bad_events(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ObjectiveSchedule(num_clients=4, **kwargs)


def test_bad_constructor_arguments():
    with pytest.raises(ValueError, match="`scheme` must be 'A', 'B' or 'C', got 'Z'"):
        FlexibleParticipation(scheme="Z")
    with pytest.raises(ValueError, match="`reboot_boost` must be a finite number >= 0"):
        FlexibleParticipation(reboot_boost=-1)


def test_resume_gives_the_same_weights(tmp_path):
    def make():
        return FlexibleParticipation(
            participation=FixedSteps(steps=[1, 0, 5, 3]), arrivals=[Arrival(client=3, round=2)], fast_reboot=True, debias_inactivity=True
        )

    straight = Quadratic(lr=0.3, lr_scheduler=StaircaseLR)
    checkpoint = ModelCheckpoint(dirpath=tmp_path, every_n_epochs=1, save_top_k=-1, filename="{epoch}")
    quadratic_trainer(max_epochs=5, algorithm=make(), callbacks=[checkpoint], enable_checkpointing=True).fit(
        straight, datamodule=quadratic_data()
    )
    resumed = Quadratic(lr=0.3, lr_scheduler=StaircaseLR)
    quadratic_trainer(max_epochs=5, algorithm=make()).fit(resumed, datamodule=quadratic_data(), ckpt_path=tmp_path / "epoch=2.ckpt")
    assert torch.equal(straight.w, resumed.w)


def test_debias_extension_with_an_always_inactive_device_stays_finite():
    model = Quadratic(lr=LR)
    algorithm = FlexibleParticipation(scheme="B", participation=FixedSteps(steps=[0, 5, 5, 5]), debias_inactivity=True)
    quadratic_trainer(max_epochs=3, algorithm=algorithm).fit(model, datamodule=quadratic_data())
    assert torch.isfinite(model.w).all()
