"""FedPer (Arivazhagan, Aggarwal, Singh & Choudhary, "Federated Learning with Personalization Layers", 2019)
and LG-FedAvg (Liang, Liu, Ziyin, Allen, Auerbach, Brent, Salakhutdinov & Morency, "Think Locally, Act
Globally: Federated Learning with Local and Global Representations", 2020): a local selection each."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from fl_lightning.algorithms.shared.personal_layers import PersonalLayers
from fl_lightning.algorithms.shared.server_optimizers import ServerOptimizer


class FedPer(PersonalLayers):
    r"""FedPer (Arivazhagan et al. 2019, Algorithm 1): FedAvg over the base layers :math:`W_B`; each client keeps
    its personalisation layers :math:`W_{P_j}` (the top of the network, e.g. the classifier head).

    Every selected client trains base and personal layers together from the global base and its own
    personal layers (the initial ones before its first round), uploads the base delta, and keeps the personal
    layers; the server averages the base deltas (sample-weighted, as the paper's
    :math:`W_B \leftarrow \sum_j \frac{n_j}{n} W_{B,j}`). See
    :class:`~fl_lightning.algorithms.shared.personal_layers.PersonalLayers` for evaluation and limits.

    Args:
        personal: the personal layers: module names (``"head"``), ``state_dict`` globs (``"classifier.*"``) or
            module classes.
        server_optimizer, weighting: as in :class:`~fl_lightning.FedAvg`.
    """

    def __init__(
        self,
        *,
        personal: Sequence[str],
        server_optimizer: ServerOptimizer | None = None,
        weighting: Literal["samples", "uniform"] = "samples",
    ) -> None:
        super().__init__(local=personal, server_optimizer=server_optimizer, weighting=weighting)


class LGFedAvg(PersonalLayers):
    r"""LG-FedAvg (Liang et al. 2020, Algorithm 1): each client keeps its local representation layers
    :math:`\theta^\ell_m` (the bottom of the network); the server averages the global layers
    :math:`\theta^g` (the top) by FedAvg.

    FedPer's mirror image: the same mechanism with the local selection at the input side. The paper's optional
    auxiliary losses on the local representation are the user's ``training_step``'s to add.

    Args:
        local: the local representation layers: module names, ``state_dict`` globs or module classes.
        server_optimizer, weighting: as in :class:`~fl_lightning.FedAvg`.
    """
