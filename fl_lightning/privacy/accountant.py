"""Privacy accounting of DP-FedAvg rounds with Google's ``dp-accounting`` library (RDP accountant).

Why this accountant: ``dp-accounting`` is maintained by Google's DP team, is what TensorFlow
Federated uses for DP-FedAvg, and its :class:`~dp_accounting.rdp.RdpAccountant` supports both
client-sampling schemes of FL: Poisson sampling (each client joins a round independently with
probability :math:`q`, add/remove-one neighbours) and fixed-size sampling without replacement (the
usual ``clients_per_round``, replace-one neighbours; Wang et al. 2019). Opacus's accountants
cover Poisson sampling only. The library is an optional dependency, imported when first used.
"""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    import dp_accounting

#: Client sampling schemes the accountant supports.
Sampling = Literal["fixed", "poisson"]


def import_dp_accounting() -> Any:
    """The ``dp_accounting`` module, or an ImportError that says how to install it."""
    try:
        import dp_accounting
    except ImportError as err:
        raise ImportError(
            'Differential privacy accounting needs Google\'s dp-accounting: pip install "fl-lightning[privacy]".'
        ) from err
    return dp_accounting


def check_delta(delta: float) -> float:
    """``delta`` as a float, checked to lie in the open interval (0, 1)."""
    if isinstance(delta, bool) or not isinstance(delta, (int, float)) or not 0 < delta < 1:
        raise ValueError(f"`delta` must be a number in the open interval (0, 1), got {delta!r}.")
    return float(delta)


class RoundAccountant:
    """ε after a number of rounds of the sampled Gaussian mechanism, at a fixed δ.

    One round is a Gaussian mechanism with noise multiplier :math:`z` (noise std over
    sensitivity) on a sample of the clients; rounds compose (RDP composition, Mironov 2017,
    Prop. 1, converted to :math:`(\\varepsilon, \\delta)` by the library).

    Args:
        noise_multiplier: :math:`z \\ge 0` (0 gives :math:`\\varepsilon = \\infty`).
        num_clients: :math:`N`, the population clients are sampled from.
        clients_per_round: :math:`m`; with Poisson sampling the expected number, :math:`q = m / N`.
        sampling: ``"fixed"`` (``m`` without replacement) or ``"poisson"``.
        delta: :math:`\\delta \\in (0, 1)`.
    """

    def __init__(
        self, *, noise_multiplier: float, num_clients: int, clients_per_round: int, sampling: Sampling, delta: float
    ) -> None:
        if sampling not in ("fixed", "poisson"):
            raise ValueError(f"`sampling` must be 'fixed' or 'poisson', got {sampling!r}.")
        if not 0 < clients_per_round <= num_clients:
            raise ValueError(f"`clients_per_round` must be in 1..{num_clients}, got {clients_per_round}.")
        self.noise_multiplier = noise_multiplier
        self.num_clients, self.clients_per_round = num_clients, clients_per_round
        self.sampling, self.delta = sampling, check_delta(delta)
        self._cache: dict[int, float] = {}

    def event(self, rounds: int) -> dp_accounting.DpEvent:
        """The library's DP event of ``rounds`` rounds."""
        dp = import_dp_accounting()
        gaussian = dp.GaussianDpEvent(self.noise_multiplier)
        if self.sampling == "poisson":
            sampled = dp.PoissonSampledDpEvent(self.clients_per_round / self.num_clients, gaussian)
        else:
            sampled = dp.SampledWithoutReplacementDpEvent(self.num_clients, self.clients_per_round, gaussian)
        return dp.SelfComposedDpEvent(sampled, rounds)

    def epsilon(self, rounds: int) -> float:
        """ε at :attr:`delta` after ``rounds`` rounds (0 for none; ∞ without noise)."""
        if rounds == 0:
            return 0.0
        if self.noise_multiplier == 0:
            return math.inf
        if rounds not in self._cache:
            dp = import_dp_accounting()
            relation = dp.NeighboringRelation
            accountant = dp.rdp.RdpAccountant(
                neighboring_relation=relation.ADD_OR_REMOVE_ONE if self.sampling == "poisson" else relation.REPLACE_ONE
            )
            self._cache[rounds] = float(accountant.compose(self.event(rounds)).get_epsilon(self.delta))
        return self._cache[rounds]


@functools.lru_cache(maxsize=1024)
def gaussian_epsilon(noise_multiplier: float, rounds: int, delta: float) -> float:
    """ε at ``delta`` of ``rounds`` compositions of the Gaussian mechanism with noise multiplier
    ``noise_multiplier`` (noise std over L2 sensitivity), without sampling, by the RDP accountant.

    Cached: a budget check asks for the next aggregation's ε, which that aggregation then logs."""
    if rounds == 0:
        return 0.0
    if noise_multiplier == 0:
        return math.inf
    dp = import_dp_accounting()
    accountant = dp.rdp.RdpAccountant()
    accountant.compose(dp.SelfComposedDpEvent(dp.GaussianDpEvent(noise_multiplier), rounds))
    return float(accountant.get_epsilon(check_delta(delta)))
