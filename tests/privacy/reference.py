"""ε computed directly with dp-accounting from each mechanism's neighbouring relation and sensitivity,
independently of fl_lightning's accountant: the references every reported ε is checked against.

Conventions of dp-accounting these rely on: its PLD accountant takes a Gaussian's ``noise_multiplier``
relative to the add/remove sensitivity, so under ``REPLACE_ONE`` it accounts a shift of twice that (one
record out, another in); its RDP analysis of sampling without replacement takes the base mechanism's
multiplier relative to the replace-one distance itself.
"""

from __future__ import annotations

import math

import dp_accounting as dp
from dp_accounting.pld import privacy_loss_distribution as PLD
from scipy.stats import norm

ADD_OR_REMOVE = dp.NeighboringRelation.ADD_OR_REMOVE_ONE
REPLACE = dp.NeighboringRelation.REPLACE_ONE


def rdp(event: dp.DpEvent, relation: dp.NeighboringRelation, delta: float) -> float:
    return float(dp.rdp.RdpAccountant(neighboring_relation=relation).compose(event).get_epsilon(delta))


def pld(event: dp.DpEvent, relation: dp.NeighboringRelation, delta: float) -> float:
    return float(dp.pld.PLDAccountant(neighboring_relation=relation).compose(event).get_epsilon(delta))


def fixed_size_rdp(num_clients: int, per_round: int, std_over_replace_shift: float, rounds: int, delta: float) -> float:
    """``rounds`` rounds of ``per_round`` of ``num_clients`` without replacement, replace-one, the Gaussian's
    std over the largest shift one replaced client causes."""
    sampled = dp.SampledWithoutReplacementDpEvent(num_clients, per_round, dp.GaussianDpEvent(std_over_replace_shift))
    return rdp(dp.SelfComposedDpEvent(sampled, rounds), REPLACE, delta)


def poisson(q: float, std_over_sensitivity: float, rounds: int, delta: float, accountant=rdp) -> float:
    """``rounds`` Poisson-sampled Gaussian mechanisms, add/remove-one."""
    event = dp.SelfComposedDpEvent(dp.PoissonSampledDpEvent(q, dp.GaussianDpEvent(std_over_sensitivity)), rounds)
    return accountant(event, ADD_OR_REMOVE, delta)


def gaussian_pld(std_over_sensitivity: float, rounds: int, delta: float, relation: dp.NeighboringRelation) -> float:
    """``rounds`` Gaussian mechanisms (std over the add/remove sensitivity) by the PLD accountant, as the one
    Gaussian of std over sensitivity divided by sqrt(rounds) that their composition exactly is (Dong et al. 2022,
    Cor. 3.3: T-fold mu-GDP is sqrt(T) mu-GDP)."""
    return pld(dp.GaussianDpEvent(std_over_sensitivity / rounds**0.5), relation, delta)


def fixed_size_pld(q: float, std_over_clip: float, rounds: int, delta: float, *, pessimistic: bool) -> float:
    """``rounds`` rounds of fixed-size sampling at rate ``q`` under replace-one by the dominating pair of Zhu et al.
    2022, ((1-q) N(0, s^2) + q N(2, s^2), N(0, s^2)) (both orders), as a mixture of Gaussians; ``pessimistic``
    rounds the losses up (an upper bound), else down (a lower bound). A coarse grid (1e-2): a few seconds."""
    mixture = PLD.from_mixture_gaussian_mechanism(
        std_over_clip, [0.0, 2.0], [1 - q, q], pessimistic_estimate=pessimistic, value_discretization_interval=1e-2
    )
    return float(mixture.self_compose(rounds).get_epsilon_for_delta(delta))


def poisson_pld_lower(q: float, std_over_sensitivity: float, rounds: int, delta: float) -> float:
    """A lower bound on the Poisson-subsampled Gaussian's ε: its PLD with the losses rounded down."""
    pld = PLD.from_gaussian_mechanism(std_over_sensitivity, sampling_prob=q, pessimistic_estimate=False)
    return float(pld.self_compose(rounds).get_epsilon_for_delta(delta))


def analytic_gaussian_epsilon(std_over_sensitivity: float, delta: float) -> float:
    """The exact ε of the Gaussian mechanism at ``delta`` (Balle & Wang 2018, Thm. 8: δ(ε) = Φ(Δ/2σ - εσ/Δ)
    - e^ε Φ(-Δ/2σ - εσ/Δ)), by bisection on that decreasing function; scipy only, no dp-accounting."""
    s = std_over_sensitivity

    def delta_of(eps: float) -> float:
        return float(norm.cdf(1 / (2 * s) - eps * s) - math.exp(eps) * norm.cdf(-1 / (2 * s) - eps * s))

    low, high = 0.0, 1.0
    while delta_of(high) > delta:
        high *= 2
    for _ in range(200):
        middle = (low + high) / 2
        low, high = (middle, high) if delta_of(middle) > delta else (low, middle)
    return high
