"""Adaptive clipping (Andrew et al. 2021, "Differentially Private Learning with Adaptive Clipping").

The clip norm tracks a quantile :math:`\\gamma` of the clients' update norms: every client reports
whether its update fits, :math:`b_k = \\mathbb{1}[\\lVert\\Delta_k\\rVert \\le C]`; the server
releases the *centred* count :math:`\\sum_k (b_k - \\tfrac12) + \\mathcal N(0, \\sigma_b^2)`, estimates
the fraction :math:`\\tilde b = \\tfrac12 + (\\sum_k (b_k - \\tfrac12) + \\mathcal N(0, \\sigma_b^2)) / m`
and takes a geometric step :math:`C \\leftarrow C \\exp(-\\eta_C (\\tilde b - \\gamma))` (their
Algorithm 1, with §3's centring). The count is a second Gaussian release; its cost is paid by
noising the update a little more (:meth:`AdaptiveClipping.update_noise_multiplier`).

Why centred: adding or removing one client moves a centred count by :math:`\\tfrac12` (an uncentred
one by 1), which is the sensitivity §3's combined multiplier assumes; under replace-one (fixed-size
sampling) both the count and the clipped sum move twice as far, so the pair is again one Gaussian
mechanism of multiplier :math:`z`, accounted as :math:`z/2` like DP-FedAvg without adaptation.
"""

from __future__ import annotations

import math

from fl_lightning.privacy.noise import NoiseSource
from fl_lightning.robust.update_bounds import positive_finite
from fl_lightning.utils.init_args import RecordsInitArgs


class AdaptiveClipping(RecordsInitArgs):
    """How DP-FedAvg adapts its clip norm (Andrew et al. 2021, Algorithm 1, geometric update).

    Args:
        target_quantile: :math:`\\gamma \\in (0, 1)`, the fraction of updates meant to fit unclipped.
        learning_rate: :math:`\\eta_C > 0`.
        count_noise_std: :math:`\\sigma_b > 0`, the std of the noise on the unclipped count; ``None``
            takes the paper's recommendation :math:`m / 20` for :math:`m` expected clients per round.
    """

    def __init__(self, *, target_quantile: float = 0.5, learning_rate: float = 0.2, count_noise_std: float | None = None) -> None:
        if isinstance(target_quantile, bool) or not isinstance(target_quantile, (int, float)) or not 0 < target_quantile < 1:
            raise ValueError(f"`target_quantile` must be a number in the open interval (0, 1), got {target_quantile!r}.")
        self.target_quantile = float(target_quantile)
        self.learning_rate = positive_finite("learning_rate", learning_rate)
        self.count_noise_std = None if count_noise_std is None else positive_finite("count_noise_std", count_noise_std)

    def noise_std(self, expected_clients: float) -> float:
        """:math:`\\sigma_b` for ``expected_clients`` per round."""
        return self.count_noise_std if self.count_noise_std is not None else expected_clients / 20

    def update_noise_multiplier(self, noise_multiplier: float, expected_clients: float) -> float:
        """The update's noise multiplier :math:`z_\\Delta = (z^{-2} - (2\\sigma_b)^{-2})^{-1/2}` that, with
        the count's noise, makes one Gaussian mechanism of multiplier :math:`z` (Andrew et al. 2021, §3).

        Raises:
            ValueError: if :math:`2\\sigma_b \\le z` (the count alone would spend the whole budget).
        """
        count_std = self.noise_std(expected_clients)
        if noise_multiplier == 0:
            return 0.0
        if 2 * count_std <= noise_multiplier:
            raise ValueError(
                f"Adaptive clipping needs 2 * count_noise_std > noise_multiplier; got count_noise_std={count_std} "
                f"and noise_multiplier={noise_multiplier}: raise count_noise_std or clients per round."
            )
        return (noise_multiplier**-2 - (2 * count_std) ** -2) ** -0.5

    def next_clip_norm(
        self, clip_norm: float, centred_count: float, expected_clients: float, source: NoiseSource
    ) -> tuple[float, float]:
        """The next clip norm and the noised unclipped fraction :math:`\\tilde b` it came from.

        Args:
            clip_norm: this round's :math:`C`.
            centred_count: :math:`\\sum_k (b_k - \\tfrac12)` over this round's updates.
            expected_clients: :math:`m`, the fixed denominator.
            source: where the count's noise comes from.
        """
        noise = source.normal(()).item() * self.noise_std(expected_clients)
        fraction = 0.5 + (centred_count + noise) / expected_clients
        return clip_norm * math.exp(-self.learning_rate * (fraction - self.target_quantile)), fraction
