"""Federated fit loops."""

from fl_lightning.loops.async_fit_loop import AsyncFitLoop
from fl_lightning.loops.federated_fit_loop import FederatedFitLoop

__all__ = ["AsyncFitLoop", "FederatedFitLoop"]
