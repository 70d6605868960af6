"""``FederatedDDPStrategy``: Lightning's DDP back-end without the per-step gradient all-reduce."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.strategies import DDPStrategy
from typing_extensions import override

from fl_lightning import _lightning_compat as compat

#: Lightning's DDP strategy names and the start method each one implies.
DDP_START_METHODS = {"ddp": "popen", "ddp_spawn": "spawn", "ddp_fork": "fork", "ddp_notebook": "fork"}
#: How long a process waits in a collective for the others before the run ends with an error. A hung
#: peer (a frozen node) would otherwise hold every process for torch's default of 30 minutes; it must
#: exceed the longest wait of a healthy round: the slowest rank's share of clients minus the fastest's.
DEFAULT_TIMEOUT = timedelta(minutes=10)


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
    ``process_group_backend``, ``start_method``); ``timeout``, how long a process waits for the
    others in a collective, defaults to :data:`DEFAULT_TIMEOUT` (10 minutes, not torch's 30): a hung
    peer then ends the run with a :class:`~fl_lightning.distributed.sharding.PeerFailureError`, and
    it resumes from the last round's checkpoint.
    """

    def __init__(self, *args: Any, timeout: timedelta | None = DEFAULT_TIMEOUT, **kwargs: Any) -> None:
        super().__init__(*args, timeout=timeout, **kwargs)

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
