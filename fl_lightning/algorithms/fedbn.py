"""FedBN (Li, Jiang, Zhang, Kamp & Dou, "FedBN: Federated Learning on Non-IID Features via Local Batch
Normalization", ICLR 2021): FedAvg that keeps every BatchNorm layer on its client."""

from __future__ import annotations

from typing import Literal

from fl_lightning.algorithms.shared.personal_layers import PersonalLayers
from fl_lightning.algorithms.shared.server_optimizers import ServerOptimizer

#: Every torch.nn BatchNorm (BatchNorm1d/2d/3d, their lazy forms, SyncBatchNorm) derives from this class.
BATCH_NORM = "_BatchNorm"


class FedBN(PersonalLayers):
    r"""FedBN (Li et al. 2021, Algorithm 1): FedAvg over every tensor except the BatchNorm layers'.

    A selection of local tensors (:class:`~fl_lightning.FederatedParameters` ``local=["_BatchNorm"]``): each
    selected client loads the global model and its own BatchNorm layers (affine :math:`\gamma, \beta` and
    running statistics; the initial ones before its first round), runs FedAvg's local work, keeps its new
    BatchNorm tensors and uploads the delta of the rest. The server averages those deltas as FedAvg does (the
    paper's :math:`w^{(l)} \leftarrow \frac{1}{K}\sum_k w_k^{(l)}` for every non-BN layer :math:`l`, Alg. 1;
    here sample-weighted by default, ``weighting="uniform"`` for the paper's equal weights). Only BatchNorm
    (``torch.nn`` ``BatchNorm1d/2d/3d``, ``SyncBatchNorm``) stays local; other normalisations (LayerNorm,
    GroupNorm) are averaged like any layer.

    **The global model's BatchNorm.** The paper defines no global BatchNorm: it evaluates each client with
    its own. Here, as in the authors' code (``server_model``), the global BatchNorm tensors are never
    aggregated and keep their initial values, so the server-side validation metrics (``val_*``) are of
    the averaged layers with the *initial* BatchNorm (running mean 0, variance 1): not FedBN's accuracy.
    FedBN's result is ``clients/personal/*`` of :class:`~fl_lightning.FederatedEvaluation`, which scores
    each client with the global layers and its own BatchNorm (:meth:`personalized_state`).

    Composes with ``DPFedAvg`` (only the averaged layers are released, clipped and noised; the BatchNorm
    never leaves the client) and with the robust rules (over the averaged layers), as every local selection
    does. See :class:`~fl_lightning.algorithms.shared.personal_layers.PersonalLayers` for sharding, executors
    and byte counts.

    Args:
        server_optimizer, weighting: as in :class:`~fl_lightning.FedAvg`.
    """

    def __init__(
        self, *, server_optimizer: ServerOptimizer | None = None, weighting: Literal["samples", "uniform"] = "samples"
    ) -> None:
        super().__init__(local=[BATCH_NORM], server_optimizer=server_optimizer, weighting=weighting)

    @property
    def local_names(self) -> frozenset[str]:
        """``state_dict`` names of the BatchNorm tensors each client keeps."""
        return frozenset(self.federation.kinds.local) if self.federation.kinds is not None else frozenset()
