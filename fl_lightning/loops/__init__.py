"""Federated fit loops."""

from fl_lightning.loops.federated_fit_loop import FederatedFitLoop

__all__ = ["FederatedFitLoop"]
