r"""ε of DP-FedAvg rounds by privacy loss distributions (PLD): the tightest bound ``dp-accounting`` computes.

A round's PLD is that of a *dominating pair* of output distributions, composed exactly by convolution
(Koskela et al. 2020; dp-accounting's :mod:`~dp_accounting.pld.privacy_loss_distribution`), with the
noise multiplier :math:`z` (std over the clip norm :math:`C`, here :math:`C = 1`) and :math:`q = m / N`:

* Poisson sampling, add/remove-one: :math:`\big((1-q)\,\mathcal N(0, z^2) + q\,\mathcal N(1, z^2),\ \mathcal N(0, z^2)\big)`
  (the Poisson-subsampled Gaussian, as dp-accounting's ``PoissonSampledDpEvent``).
* Fixed-size sampling without replacement, replace-one: one replaced client moves the clipped sum by up to
  :math:`2C`, and a sample of :math:`m` of :math:`N` holds it with probability :math:`q`, so
  :math:`\big((1-q)\,\mathcal N(0, z^2) + q\,\mathcal N(2, z^2),\ \mathcal N(0, z^2)\big)` dominates a round
  (Zhu, Dong & Wang 2022, "Optimal Accounting of Differential Privacy via Characteristic Function", AISTATS:
  the dominating pair of subsampling without replacement under the substitution relation is
  :math:`((1-\gamma)Q + \gamma P, Q)` for a pair :math:`(P, Q)` of the base mechanism, :math:`\gamma = m/N`).

Both orders of each pair are accounted (dp-accounting's "add" and "remove" distributions), as neighbouring is
symmetric. The privacy losses are discretised pessimistically (rounded up) on a grid of
:data:`DISCRETISATION`, so ε is an upper bound; at :math:`q = 1` it is the exact analytic Gaussian's
(Balle & Wang 2018, Thm. 8) up to that rounding, never below it.
"""

from __future__ import annotations

import functools
from typing import Any

from fl_lightning.privacy.ledger import Entries

#: The privacy-loss grid's spacing: 1e-3 gives dp-accounting's default (1e-4) ε to 4 digits at a tenth of the cost.
DISCRETISATION = 1e-3


@functools.lru_cache(maxsize=64)
def round_pld(sampling: str, noise_multiplier: float, sampling_prob: float) -> Any:
    """The PLD of one round: the dominating pair of ``sampling`` (``"poisson"`` or ``"fixed"``) above."""
    from dp_accounting.pld import privacy_loss_distribution

    return privacy_loss_distribution.from_gaussian_mechanism(
        standard_deviation=noise_multiplier,
        sensitivity=1.0 if sampling == "poisson" else 2.0,
        sampling_prob=sampling_prob,
        value_discretization_interval=DISCRETISATION,
    )


def pld_epsilon(sampling: str, entries: Entries, delta: float) -> float:
    """ε at ``delta`` of the ledger ``entries`` ``((z, N, m), rounds)`` (every round noised, at least one)."""
    composed = None
    for (noise_multiplier, num_clients, clients_per_round), rounds in entries:
        rounds_pld = round_pld(sampling, noise_multiplier, clients_per_round / num_clients).self_compose(rounds)
        composed = rounds_pld if composed is None else composed.compose(rounds_pld)
    assert composed is not None, "a ledger with no release costs nothing and is not accounted"
    return float(composed.get_epsilon_for_delta(delta))
