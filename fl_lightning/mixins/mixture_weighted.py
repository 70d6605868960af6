"""Client side of FedEM: a component trained on the sample-weighted loss of its responsibilities."""

from __future__ import annotations

from typing import Any

from torch import Tensor
from typing_extensions import override

from fl_lightning.evaluation.probe import WeightSets, sample_metrics_many
from fl_lightning.mixins.applied_term import AppliedTermMixin, term_step


def responsibilities(losses: Tensor, log_pi: Tensor) -> Tensor:
    r"""FedEM's E-step (Marfoq et al. 2021, Alg. 1):
    :math:`q(z_i = m) \propto \pi_m \exp(-\ell(h_{\theta_m}(x_i), y_i))`, i.e. a softmax over
    ``log_pi - losses`` (``losses`` is ``[n, M]``, ``log_pi`` is ``[M]``); rows sum to 1."""
    return (log_pi.to(losses) - losses).softmax(dim=1)


class MixtureWeightedMixin(AppliedTermMixin):
    r"""Trains one FedEM component on :math:`\frac{1}{B}\sum_i q(z_i = m)\,\ell(h_{\theta_m}(x_i), y_i)`.

    The weights :math:`q` are recomputed on each batch from the round's frozen components and
    the client's previous :math:`\pi` (no sample indices needed, so any data pipeline works);
    the module must implement ``sample_metrics(batch) -> {"loss": Tensor[B]}``. Without a
    component set (:meth:`set_mixture_component`), ``training_step`` is the module's own.
    """

    _mixture: tuple[WeightSets, Tensor, int] | None = None

    def set_mixture_component(self, components: WeightSets | None, log_pi: Tensor | None = None, index: int = 0) -> None:
        """Train component ``index`` of ``components`` with prior ``log_pi`` (``None``: plain training)."""
        if components is None or log_pi is None:
            self._mixture = None
            self._set_term(MixtureWeightedMixin, False)
            return
        if not 0 <= index < len(components):
            raise ValueError(f"Component index {index} is out of range for {len(components)} components.")
        self._mixture = (components, log_pi, index)
        self._set_term(MixtureWeightedMixin, True)

    @term_step
    @override
    def training_step(self, batch: Any, batch_idx: int) -> Any:
        if self._mixture is None:
            return super().training_step(batch, batch_idx)  # type: ignore[misc]
        components, log_pi, index = self._mixture
        self._count_term_step(MixtureWeightedMixin)
        frozen = sample_metrics_many(self, components, [batch])["loss"].T  # type: ignore[arg-type]
        q = responsibilities(frozen, log_pi)[:, index]
        losses = self.sample_metrics(batch)["loss"]  # type: ignore[attr-defined]
        return (q.to(losses) * losses).mean()
