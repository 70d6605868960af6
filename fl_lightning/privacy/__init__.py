"""Differential privacy for federated training: DP-FedAvg (and over asynchronous buffers), DP-FTRL, adaptive clipping, local DP, privacy accounting."""

from fl_lightning.privacy.accountant import RoundAccountant, gaussian_epsilon
from fl_lightning.privacy.adaptive_clipping import AdaptiveClipping
from fl_lightning.privacy.dp_fedavg import DPFedAvg
from fl_lightning.privacy.dp_fedbuff import DPFedBuff
from fl_lightning.privacy.dp_ftrl import DPFTRL
from fl_lightning.privacy.local_dp import LocalDP

__all__ = ["AdaptiveClipping", "DPFTRL", "DPFedAvg", "DPFedBuff", "LocalDP", "RoundAccountant", "gaussian_epsilon"]
