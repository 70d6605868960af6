"""Differential privacy for federated training: DP-FedAvg, adaptive clipping, privacy accounting."""

from fl_lightning.privacy.accountant import RoundAccountant
from fl_lightning.privacy.adaptive_clipping import AdaptiveClipping
from fl_lightning.privacy.dp_fedavg import DPFedAvg

__all__ = ["AdaptiveClipping", "DPFedAvg", "RoundAccountant"]
