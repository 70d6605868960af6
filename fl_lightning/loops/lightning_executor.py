"""``client_executor="lightning"``: each client through Lightning's training-epoch loop, every hook and callback."""

from __future__ import annotations

from collections.abc import Sized

from typing_extensions import override

from fl_lightning import _lightning_compat as compat
from fl_lightning.loops.client_executor import SequentialExecutor


class LightningExecutor(SequentialExecutor):
    """Runs a client's batches through :class:`~fl_lightning._lightning_compat.ClientEpochLoop`;
    the loss recorder sees each step through its ``on_train_batch_end`` callback."""

    name = "lightning"

    @override
    def run_steps(self, batches: Sized) -> int:
        return compat.run_client_epoch(self.runtime.trainer.fit_loop, batches)
