"""FedProx (Li et al. 2020): FedAvg with a proximal term in the local objective."""

from __future__ import annotations

from typing import ClassVar

import lightning.pytorch as pl

from fl_lightning.algorithms.shared.algorithm import ClientContext
from fl_lightning.algorithms.fedavg import FedAvg
from fl_lightning.algorithms.shared.server_optimizers import ServerOptimizer
from fl_lightning.server.federation import Federation
from fl_lightning.mixins.proximal import ProximalMixin
from fl_lightning.mixins.required import require_mixin
from fl_lightning.server.model_state import State
from fl_lightning.utils.checks import non_negative


class FedProx(FedAvg):
    r"""FedAvg whose clients minimise :math:`F_k(w) + \frac{\mu}{2}\lVert w - w^t\rVert^2` (Li et al. 2020, eq. 2).

    Differs from :class:`FedAvg` only in :meth:`configure_client`, which sets the proximal
    centre on the module; the module must inherit :class:`~fl_lightning.ProximalMixin`.
    Aggregation is FedAvg's (sample-weighted), as in the paper's experiments.

    Args:
        mu: proximal coefficient :math:`\mu \ge 0`; ``mu=0`` is FedAvg.
    """

    configure_client_sets_terms: ClassVar[bool] = True

    def __init__(
        self,
        *,
        mu: float = 0.01,
        server_optimizer: ServerOptimizer | None = None,
        weighting: str = "samples",
    ) -> None:
        non_negative("mu", mu)
        super().__init__(server_optimizer=server_optimizer, weighting=weighting)  # type: ignore[arg-type]
        self.mu = mu

    def setup(self, federation: Federation) -> None:
        require_mixin(federation.module, ProximalMixin, self)
        super().setup(federation)

    def configure_client(self, client: ClientContext, module: pl.LightningModule, global_state: State) -> None:
        module.set_proximal_center(global_state, self.mu)  # type: ignore[attr-defined]
