"""Privacy accounting of DP-FedAvg rounds with Google's ``dp-accounting`` library (PLD or RDP accountant).

Why this library: ``dp-accounting`` is maintained by Google's DP team, is what TensorFlow Federated
uses for DP-FedAvg, and covers both client-sampling schemes of FL: Poisson sampling (each client
joins a round independently with probability :math:`q`, add/remove-one neighbours) and fixed-size
sampling without replacement (the usual ``clients_per_round``, replace-one neighbours). Opacus's
accountants cover Poisson sampling only. The library is an optional dependency, imported when first used.

Two accountants (``accounting``): ``"pld"`` (the default, :mod:`fl_lightning.privacy.pld`), the privacy
loss distribution of each sampling's dominating pair, the tightest; ``"rdp"``, Rényi DP (Mironov 2017;
Wang et al. 2019 for sampling without replacement), looser (fixed-size sampling by a median 2.4×) but
the long-standing TF Federated figure.

What a run released is a :class:`~fl_lightning.privacy.ledger.Ledger` of settings and counts, so a
run resumed with other settings composes the rounds it released at each one.
"""

from __future__ import annotations

import functools
import logging
import math
from typing import TYPE_CHECKING, Any, Literal

from typing_extensions import override

if TYPE_CHECKING:
    import dp_accounting

from fl_lightning.privacy.ledger import Entries
from fl_lightning.privacy.pld import pld_epsilon

#: Client sampling schemes the accountant supports.
Sampling = Literal["fixed", "poisson"]
#: The accountants: privacy loss distributions or Rényi DP.
Accounting = Literal["pld", "rdp"]

#: dp-accounting's RDP accountant logs this (through absl) for every order whose series it cuts short; it
#: then leaves that order out of the minimum over orders, so ε stays a valid bound and the user cannot act on it.
_NOT_CONVERGED = "_compute_log_a_frac failed to converge"


class _DropNotConverged(logging.Filter):
    """Drops dp-accounting's "failed to converge" records; every other absl record passes."""

    @override
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(_NOT_CONVERGED)


def import_dp_accounting() -> Any:
    """The ``dp_accounting`` module (its convergence notes silenced), or an ImportError that says how to install it."""
    try:
        import dp_accounting
    except ImportError as err:
        raise ImportError(
            'Differential privacy accounting needs Google\'s dp-accounting: pip install "fl-lightning[privacy]".'
        ) from err
    absl = logging.getLogger("absl")
    if not any(isinstance(f, _DropNotConverged) for f in absl.filters):
        absl.addFilter(_DropNotConverged())
    return dp_accounting


def check_accounting(accounting: Accounting) -> Accounting:
    """``accounting``, checked to be ``"pld"`` or ``"rdp"``."""
    if accounting not in ("pld", "rdp"):
        raise ValueError(f"`accounting` must be 'pld' or 'rdp', got {accounting!r}.")
    return accounting


def check_delta(delta: float) -> float:
    """``delta`` as a float, checked to lie in the open interval (0, 1)."""
    if isinstance(delta, bool) or not isinstance(delta, (int, float)) or not 0 < delta < 1:
        raise ValueError(f"`delta` must be a number in the open interval (0, 1), got {delta!r}.")
    return float(delta)


class RoundAccountant:
    """ε of rounds of the sampled Gaussian mechanism, at a fixed δ.

    One round is a Gaussian mechanism with noise multiplier :math:`z` (noise std over the clip
    norm :math:`C`) on a sample of the clients; rounds compose, by convolving their privacy loss
    distributions (``accounting="pld"``: :mod:`fl_lightning.privacy.pld`) or by RDP composition
    (``"rdp"``: Mironov 2017, Prop. 1, converted to :math:`(\\varepsilon, \\delta)` by the library).

    Neighbouring relations: Poisson sampling pairs with add/remove-one (one client's clipped update
    joins or leaves the sum: sensitivity :math:`C`, multiplier :math:`z`); fixed-size sampling
    without replacement pairs with replace-one (one client's update swapped for another's: the sum
    moves by up to :math:`2C`, so the multiplier relative to that sensitivity is :math:`z/2`,
    as dp-accounting's RDP analysis of sampling without replacement takes its base mechanism's
    sensitivity to be the replace-one distance; the PLD accounts the shift :math:`2C` itself).

    Args:
        noise_multiplier: :math:`z \\ge 0` (0 gives :math:`\\varepsilon = \\infty`).
        num_clients: :math:`N`, the population clients are sampled from.
        clients_per_round: :math:`m`; with Poisson sampling the expected number, :math:`q = m / N`.
        sampling: ``"fixed"`` (``m`` without replacement) or ``"poisson"``.
        delta: :math:`\\delta \\in (0, 1)`.
        accounting: ``"pld"`` (tightest) or ``"rdp"``.
    """

    def __init__(
        self,
        *,
        noise_multiplier: float,
        num_clients: int,
        clients_per_round: int,
        sampling: Sampling,
        delta: float,
        accounting: Accounting = "pld",
    ) -> None:
        if sampling not in ("fixed", "poisson"):
            raise ValueError(f"`sampling` must be 'fixed' or 'poisson', got {sampling!r}.")
        if not 0 < clients_per_round <= num_clients:
            raise ValueError(f"`clients_per_round` must be in 1..{num_clients}, got {clients_per_round}.")
        self.noise_multiplier = noise_multiplier
        self.num_clients, self.clients_per_round = num_clients, clients_per_round
        self.sampling, self.delta = sampling, check_delta(delta)
        self.accounting = check_accounting(accounting)

    @property
    def setting(self) -> tuple[float, ...]:
        """This accountant's round as a ledger setting: :math:`(z, N, m)`."""
        return (float(self.noise_multiplier), float(self.num_clients), float(self.clients_per_round))

    def event(self, rounds: int) -> dp_accounting.DpEvent:
        """The library's RDP event of ``rounds`` rounds at this accountant's setting."""
        return self.composed_event(((self.setting, rounds),))

    def composed_event(self, entries: Entries) -> dp_accounting.DpEvent:
        """The library's RDP event of the ledger ``entries``: each ``((z, N, m), rounds)`` in turn."""
        dp = import_dp_accounting()
        events = []
        for (noise_multiplier, num_clients, clients_per_round), rounds in entries:
            if self.sampling == "poisson":
                gaussian = dp.GaussianDpEvent(noise_multiplier)
                sampled = dp.PoissonSampledDpEvent(clients_per_round / num_clients, gaussian)
            else:
                gaussian = dp.GaussianDpEvent(noise_multiplier / 2)  # replace-one: sensitivity 2C
                sampled = dp.SampledWithoutReplacementDpEvent(int(num_clients), int(clients_per_round), gaussian)
            events.append(dp.SelfComposedDpEvent(sampled, rounds))
        return dp.ComposedDpEvent(events)

    def epsilon(self, rounds: int) -> float:
        """ε at :attr:`delta` after ``rounds`` rounds at this setting (0 for none; ∞ without noise)."""
        return self.spent_epsilon(((self.setting, rounds),))

    def spent_epsilon(self, entries: Entries) -> float:
        """ε at :attr:`delta` of the ledger ``entries`` (0 for no rounds; ∞ if any round had no noise)."""
        return _epsilon(self, tuple(entries))


def _released(entries: Entries) -> Entries:
    """The ledger ``entries`` that released at least once."""
    return tuple((setting, count) for setting, count in entries if count > 0)


def _trivial_epsilon(entries: Entries) -> float | None:
    """ε without an accountant: 0 when nothing was released, ∞ when a release had no noise (z = 0)."""
    if not entries:
        return 0.0
    if any(setting[0] == 0 for setting, _ in entries):
        return math.inf
    return None


@functools.lru_cache(maxsize=1024)
def _epsilon(accountant: RoundAccountant, entries: Entries) -> float:
    """Cached: the budget check asks for the next round's ε, which that round then logs."""
    entries = _released(entries)
    if (trivial := _trivial_epsilon(entries)) is not None:
        return trivial
    dp = import_dp_accounting()
    if accountant.accounting == "pld":
        return pld_epsilon(accountant.sampling, entries, accountant.delta)
    relation = dp.NeighboringRelation
    rdp = dp.rdp.RdpAccountant(
        neighboring_relation=relation.ADD_OR_REMOVE_ONE if accountant.sampling == "poisson" else relation.REPLACE_ONE
    )
    return float(rdp.compose(accountant.composed_event(entries)).get_epsilon(accountant.delta))


@functools.lru_cache(maxsize=1024)
def gaussian_epsilon(noise_multiplier: float, rounds: int, delta: float) -> float:
    """ε at ``delta`` of ``rounds`` compositions of the Gaussian mechanism with noise multiplier
    ``noise_multiplier`` (noise std over L2 sensitivity), without sampling, by the RDP accountant."""
    return composed_gaussian_epsilon((((float(noise_multiplier),), rounds),), delta)


@functools.lru_cache(maxsize=1024)
def composed_gaussian_epsilon(entries: Entries, delta: float) -> float:
    """ε at ``delta`` of the ledger ``entries`` ``((z,), count)``: ``count`` Gaussian mechanisms of
    multiplier :math:`z` (noise std over L2 sensitivity) each, in turn, without sampling (RDP accountant).

    Cached: a budget check asks for the next aggregation's ε, which that aggregation then logs."""
    entries = _released(entries)
    if (trivial := _trivial_epsilon(entries)) is not None:
        return trivial
    dp = import_dp_accounting()
    accountant = dp.rdp.RdpAccountant()
    accountant.compose(dp.ComposedDpEvent([dp.SelfComposedDpEvent(dp.GaussianDpEvent(s[0]), c) for s, c in entries]))
    return float(accountant.get_epsilon(check_delta(delta)))
