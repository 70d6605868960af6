"""``FederatedDDPStrategy``: Lightning's DDP back-end without the per-step gradient all-reduce."""

from __future__ import annotations

import lightning.pytorch as pl
from lightning.pytorch.strategies import DDPStrategy
from typing_extensions import override

from fl_lightning import _lightning_compat as compat

#: Lightning's DDP strategy names and the start method each one implies.
DDP_START_METHODS = {"ddp": "popen", "ddp_spawn": "spawn", "ddp_fork": "fork", "ddp_notebook": "fork"}


class FederatedDDPStrategy(DDPStrategy):
    """DDP for federated learning: each process trains different clients.

    Lightning's :class:`~lightning.pytorch.strategies.DDPStrategy` wraps the module in
    ``DistributedDataParallel``, which all-reduces gradients on every step: wrong here, since
    every rank trains a different client. This strategy keeps the module unwrapped and only
    broadcasts rank 0's initial weights at set-up; the federated loop combines the round's
    updates with one all-reduce (:class:`~fl_lightning.distributed.ClientSharding`).
    Processes are launched the usual Lightning way (``devices=N``, ``torchrun``, SLURM);
    ``FederatedTrainer(strategy="ddp")`` selects this strategy.

    Takes :class:`~lightning.pytorch.strategies.DDPStrategy`'s arguments (e.g.
    ``process_group_backend``, ``timeout``, ``start_method``).
    """

    @override
    def configure_ddp(self) -> None:
        assert isinstance(self.model, pl.LightningModule)
        compat.sync_module_states(self.model)

    @classmethod
    def from_name(cls, name: str) -> FederatedDDPStrategy:
        """The federated counterpart of a Lightning DDP strategy name (``"ddp"``, ``"ddp_spawn"``, ...)."""
        base = name.removesuffix("_find_unused_parameters_true").removesuffix("_find_unused_parameters_false")
        if base not in DDP_START_METHODS:
            raise ValueError(f"Unknown DDP strategy {name!r}: use one of {sorted(DDP_START_METHODS)}.")
        return cls(start_method=DDP_START_METHODS[base])
