"""ε computed directly with dp-accounting from each mechanism's neighbouring relation and sensitivity,
independently of fl_lightning's accountant: the references every reported ε is checked against.

Conventions of dp-accounting these rely on: its PLD accountant takes a Gaussian's ``noise_multiplier``
relative to the add/remove sensitivity, so under ``REPLACE_ONE`` it accounts a shift of twice that (one
record out, another in); its RDP analysis of sampling without replacement takes the base mechanism's
multiplier relative to the replace-one distance itself.
"""

from __future__ import annotations

import dp_accounting as dp

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
