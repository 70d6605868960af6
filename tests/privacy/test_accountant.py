"""RoundAccountant never reports less ε than dp-accounting computed here from each sampling scheme's
neighbouring relation, over a grid of settings: its RDP accountant against dp-accounting's RDP, its PLD
accountant (the default) against the dominating pairs' PLDs built another way and, without sampling, against
the exact analytic Gaussian."""

from __future__ import annotations

import math

import dp_accounting as dp
import pytest

from fl_lightning.privacy import RoundAccountant
from fl_lightning.privacy import accountant as accountant_module
from tests.privacy import reference

# (N, m, z, T, delta): a small grid across sampling rates, noise, rounds and delta.
GRID = [
    (100, 10, 0.8, 1, 1e-5),
    (100, 10, 2.0, 50, 1e-3),
    (1000, 10, 1.0, 100, 1e-5),
    (1000, 50, 1.0, 20, 1e-6),
    (20, 20, 2.0, 1, 1e-5),
    (20, 20, 3.0, 10, 1e-4),
]


def _ours(num_clients, per_round, z, sampling, delta, accounting="rdp") -> RoundAccountant:
    return RoundAccountant(
        noise_multiplier=z,
        num_clients=num_clients,
        clients_per_round=per_round,
        sampling=sampling,
        delta=delta,
        accounting=accounting,
    )


@pytest.mark.parametrize(("num_clients", "per_round", "z", "rounds", "delta"), [GRID[0], GRID[2], GRID[5]])
def test_fixed_size_pld_is_zhu_et_als_dominating_pair(num_clients, per_round, z, rounds, delta):
    """Within the two discretisations (rounded down, up) of ((1-q) N(0, z^2) + q N(2, z^2), N(0, z^2)), as a
    mixture of Gaussians, and below RDP's figure."""
    ours = _ours(num_clients, per_round, z, "fixed", delta, "pld").epsilon(rounds)
    q = per_round / num_clients
    assert reference.fixed_size_pld(q, z, rounds, delta, pessimistic=False) <= ours
    assert ours <= reference.fixed_size_pld(q, z, rounds, delta, pessimistic=True) * (1 + 1e-9)
    assert ours <= _ours(num_clients, per_round, z, "fixed", delta).epsilon(rounds)


@pytest.mark.parametrize(("num_clients", "per_round", "z", "rounds", "delta"), GRID[:4])
def test_poisson_pld_is_dp_accountings_pld(num_clients, per_round, z, rounds, delta):
    ours = _ours(num_clients, per_round, z, "poisson", delta, "pld").epsilon(rounds)
    q = per_round / num_clients
    assert reference.poisson_pld_lower(q, z, rounds, delta) <= ours
    assert ours == pytest.approx(reference.poisson(q, z, rounds, delta, accountant=reference.pld), rel=1e-3)


@pytest.mark.parametrize(("sampling", "sensitivity"), [("fixed", 2.0), ("poisson", 1.0)])
@pytest.mark.parametrize(("z", "rounds", "delta"), [(2.0, 1, 1e-5), (3.0, 10, 1e-4), (0.7, 50, 1e-6)])
def test_pld_without_sampling_is_never_below_the_exact_analytic_gaussian(sampling, sensitivity, z, rounds, delta):
    """q = 1: T rounds are one Gaussian of std z / sqrt(T) over the shift (2C replace-one, C add/remove), whose exact
    ε is Balle & Wang's; the PLD may round up, never down, and stays within 1 %."""
    ours = _ours(20, 20, z, sampling, delta, "pld").epsilon(rounds)
    exact = reference.analytic_gaussian_epsilon(z / sensitivity / rounds**0.5, delta)
    assert exact <= ours <= exact * 1.01


def test_the_audits_cells_by_pld_and_rdp():
    """Issue 38: N = 1000, m = 10, z = 1, T = 100 is 11.21 by RDP and 6.48 by the dominating pair's PLD;
    q = 0.001, z = 0.3, T = 10^4 is 313,231 by RDP and 421 by PLD (the audit's 428, on another grid)."""
    headline = [_ours(1000, 10, 1.0, "fixed", 1e-5, a).epsilon(100) for a in ("rdp", "pld")]
    assert headline == [pytest.approx(11.21, abs=0.01), pytest.approx(6.48, abs=0.01)]
    audit = [_ours(1000, 1, 0.3, "fixed", 1e-5, a).epsilon(10_000) for a in ("rdp", "pld")]
    assert audit == [pytest.approx(313_231, rel=1e-4), pytest.approx(421.07, rel=1e-3)]
    assert audit[1] <= 428 * 1.1


@pytest.mark.parametrize(("num_clients", "per_round", "z", "rounds", "delta"), GRID)
def test_fixed_size_sampling_accounts_the_2c_shift_of_replace_one(num_clients, per_round, z, rounds, delta):
    ours = _ours(num_clients, per_round, z, "fixed", delta).epsilon(rounds)
    # Replacing one client's clipped update moves the sum by up to 2C; the noise's std is zC.
    assert ours >= reference.fixed_size_rdp(num_clients, per_round, z / 2, rounds, delta) * (1 - 1e-12)
    if per_round == num_clients:  # no sampling: the exact PLD of the Gaussian under replace-one applies
        assert ours >= reference.gaussian_pld(z, rounds, delta, reference.REPLACE)


def test_fixed_size_sampling_reports_the_audits_values():
    """The audit's cases (issue 24): q = 1, z = 2 is 4.38 by PLD (2.17 was reported); N = 1000, m = 10,
    z = 1, T = 100 is 11.21 (1.48 was reported)."""
    assert _ours(5, 5, 2.0, "fixed", 1e-5).epsilon(1) >= 4.377
    assert _ours(1000, 10, 1.0, "fixed", 1e-5).epsilon(100) >= 11.2


@pytest.mark.parametrize(("num_clients", "per_round", "z", "rounds", "delta"), GRID[:4])
def test_poisson_sampling_is_never_below_rdp_or_pld(num_clients, per_round, z, rounds, delta):
    ours = _ours(num_clients, per_round, z, "poisson", delta).epsilon(rounds)
    q = per_round / num_clients
    assert ours >= reference.poisson(q, z, rounds, delta) * (1 - 1e-12)
    assert ours >= reference.poisson(q, z, rounds, delta, accountant=reference.pld)
    assert 0 < _ours(num_clients, per_round, z, "poisson", delta).epsilon(1) <= ours  # composition spends more


def test_a_ledger_composes_each_setting_it_released():
    """Rounds at z = 0.5, then at z = 2: ε is that of both, not of all rounds at the last z."""
    ours = _ours(100, 10, 2.0, "fixed", 1e-5)
    entries = (((0.5, 100.0, 10.0), 5), ((2.0, 100.0, 10.0), 1))
    at_old = reference.fixed_size_rdp(100, 10, 0.25, 5, 1e-5)
    assert ours.spent_epsilon(entries) >= at_old > ours.epsilon(6)
    def sampled(z: float) -> dp.DpEvent:
        return dp.SampledWithoutReplacementDpEvent(100, 10, dp.GaussianDpEvent(z / 2))

    both = dp.ComposedDpEvent([dp.SelfComposedDpEvent(sampled(0.5), 5), sampled(2.0)])
    assert ours.spent_epsilon(entries) >= reference.rdp(both, reference.REPLACE, 1e-5) * (1 - 1e-12)
    pld = _ours(100, 10, 2.0, "fixed", 1e-5, "pld")
    assert pld.spent_epsilon(entries) >= reference.fixed_size_pld(0.1, 0.5, 5, 1e-5, pessimistic=False)
    assert pld.spent_epsilon(entries) > pld.spent_epsilon(entries[:1]) > pld.epsilon(6)


@pytest.mark.parametrize("accounting", ["rdp", "pld"])
def test_no_rounds_cost_nothing_and_no_noise_is_infinite(accounting):
    ours = _ours(10, 2, 0.0, "fixed", 1e-5, accounting)
    assert ours.epsilon(0) == 0.0 and ours.epsilon(3) == math.inf


def test_the_accountant_does_not_print_dp_accountings_convergence_notes(caplog):
    """A setting whose small orders do not converge (dp-accounting's own test case) logs nothing through absl."""
    ours = _ours(100, 10, 1.0, "poisson", 1e-5)
    with caplog.at_level("WARNING"):
        assert math.isfinite(ours.epsilon(5))
    assert not [r for r in caplog.records if "failed to converge" in r.getMessage()]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"delta": 0.0}, "delta"),
        ({"delta": 1.0}, "delta"),
        ({"sampling": "any"}, "sampling"),
        ({"clients_per_round": 11}, "clients_per_round"),
        ({"accounting": "prv"}, "accounting"),
    ],
)
def test_bad_input_is_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        RoundAccountant(
            **{"noise_multiplier": 1.0, "num_clients": 10, "clients_per_round": 2, "sampling": "fixed", "delta": 1e-5, **kwargs}
        )


def test_missing_library_names_the_extra(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "dp_accounting", None)  # import now raises ImportError
    with pytest.raises(ImportError, match=r'pip install "fl-lightning\[privacy\]"'):
        accountant_module.import_dp_accounting()
