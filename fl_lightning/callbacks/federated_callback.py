"""Round- and client-level hooks, on top of Lightning's ``Callback``."""

from __future__ import annotations

from typing import TYPE_CHECKING

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback

if TYPE_CHECKING:
    from fl_lightning.algorithms.shared.algorithm import ClientContext, ClientUpdate


class FederatedCallback(Callback):
    """A Lightning ``Callback`` that also hears the federated loop's events.

    Lightning's own hooks keep their meaning, with one epoch = one round
    (``on_train_epoch_start/end``); training-batch hooks fire for every client's steps.
    """

    def on_clients_selected(self, trainer: pl.Trainer, pl_module: pl.LightningModule, round_idx: int, client_ids: list[int]) -> None:
        """Called once per round, after client selection."""

    def on_client_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, client: ClientContext) -> None:
        """Called before a client's local training (global weights loaded, client configured)."""

    def on_client_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, client: ClientContext, update: ClientUpdate) -> None:
        """Called after a client's update is computed, before aggregation."""

    def on_round_aggregated(self, trainer: pl.Trainer, pl_module: pl.LightningModule, round_idx: int, metrics: dict[str, float]) -> None:
        """Called after aggregation and server evaluation, with the round's loop-level metrics."""


def call_federated_hook(trainer: pl.Trainer, name: str, *args: object) -> None:
    """Calls hook ``name`` on every :class:`FederatedCallback` of the trainer that overrides it (the base class's do
    nothing, and some run once per client)."""
    default = getattr(FederatedCallback, name)
    for callback in trainer.callbacks:  # type: ignore[attr-defined]
        if isinstance(callback, FederatedCallback):
            hook = getattr(callback, name)
            if getattr(hook, "__func__", None) is not default:
                hook(trainer, trainer.lightning_module, *args)
