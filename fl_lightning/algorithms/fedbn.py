"""FedBN (Li, Jiang, Zhang, Kamp & Dou, "FedBN: Federated Learning on Non-IID Features via Local Batch
Normalization", ICLR 2021): FedAvg that keeps every BatchNorm layer on its client."""

from __future__ import annotations

import lightning.pytorch as pl
from torch import nn
from typing_extensions import override

from fl_lightning.algorithms.shared.algorithm import ClientContext, ClientUpdate
from fl_lightning.algorithms.shared.personalized import PersonalizedFedAvg
from fl_lightning.server.federation import Federation
from fl_lightning.server.model_state import State, load_into


def batch_norm_names(module: nn.Module) -> list[str]:
    """``state_dict`` names of every BatchNorm layer's tensors (weight, bias, running_mean, running_var,
    num_batches_tracked), in ``state_dict`` order: ``BatchNorm1d/2d/3d``, their lazy forms and ``SyncBatchNorm``."""
    layers = {name for name, m in module.named_modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)}
    return [name for name in module.state_dict() if name.rpartition(".")[0] in layers]


class FedBN(PersonalizedFedAvg):
    r"""FedBN (Li et al. 2021, Algorithm 1): FedAvg over every tensor except the BatchNorm layers'.

    Each selected client loads the global model, replaces its BatchNorm layers (affine
    :math:`\gamma, \beta` and running statistics) by its own from :attr:`personal` (the global, i.e.
    initial, ones before its first round), runs FedAvg's local work, keeps its new BatchNorm tensors and
    uploads the delta of the rest. The server averages those deltas as FedAvg does (the paper's
    :math:`w^{(l)} \leftarrow \frac{1}{K}\sum_k w_k^{(l)}` for every non-BN layer :math:`l`, Alg. 1; here
    sample-weighted by default, ``weighting="uniform"`` for the paper's equal weights). Only BatchNorm
    (``torch.nn`` ``BatchNorm1d/2d/3d``, ``SyncBatchNorm``) stays local; other normalisations (LayerNorm,
    GroupNorm) are averaged like any layer.

    **The global model's BatchNorm.** The paper defines no global BatchNorm: it evaluates each client with
    its own. Here, as in the authors' code (``server_model``), the global BatchNorm tensors are never
    aggregated and keep their initial values, so the server-side validation metrics (``val_*``) are of
    the averaged layers with the *initial* BatchNorm (running mean 0, variance 1): not FedBN's accuracy.
    FedBN's result is ``clients/personal/*`` of :class:`~fl_lightning.FederatedEvaluation`, which scores
    each client with the global layers and its own BatchNorm (:meth:`personalized_state`).

    Shards: no (the store is per process; see :class:`PersonalizedFedAvg`). The batched executor is
    refused (it runs plain SGD from the global weights). Composes with ``DPFedAvg`` (only the averaged
    layers are released, clipped and noised; the BatchNorm statistics never leave the client) and with the
    robust rules (over the averaged layers). ``round/upload_bytes`` counts the averaged layers only;
    ``round/download_bytes`` the whole global model (a client's first round needs its BatchNorm too).

    Args:
        server_optimizer, weighting: as in :class:`~fl_lightning.FedAvg`.
    """

    #: ``state_dict`` names of the BatchNorm tensors each client keeps (set in :meth:`setup`).
    local_names: frozenset[str] = frozenset()

    @override
    def setup(self, federation: Federation) -> None:
        names = batch_norm_names(federation.module)
        if not names:
            raise ValueError(
                f"FedBN keeps the BatchNorm layers on the clients, but {type(federation.module).__name__} has no "
                "torch.nn BatchNorm1d/2d/3d or SyncBatchNorm layer with parameters or running statistics: add one, "
                "or use FedAvg."
            )
        super().setup(federation)
        self.local_names = frozenset(names)

    @override
    def configure_client(self, client: ClientContext, module: pl.LightningModule, global_state: State) -> None:
        own = self.personal.get(client.client_id)
        if own is not None:
            live = self.federation.local_weights()
            load_into({name: live[name] for name in own}, own)

    @override
    def client_update(self, client: ClientContext, module: pl.LightningModule, delta: State) -> ClientUpdate:
        """Keeps the client's BatchNorm tensors; uploads the delta of the others."""
        live = self.federation.local_weights()
        self.personal.put(client.client_id, {name: live[name] for name in self.local_names})
        return super().client_update(client, module, {k: v for k, v in delta.items() if k not in self.local_names})

    @override
    def apply_weighted_sum(self, round_idx: int, global_state: State, total: State, weight: float) -> dict[str, float]:
        """FedAvg's step on the averaged layers; the global BatchNorm tensors stay as they are."""
        shared = {k: v for k, v in global_state.items() if k not in self.local_names}
        return super().apply_weighted_sum(round_idx, shared, total, weight)
