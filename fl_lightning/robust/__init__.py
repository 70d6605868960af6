"""Byzantine robustness: attacks by a fraction of malicious clients, and robust aggregation against them."""

from fl_lightning.robust.aggregators import Bulyan, CoordinateMedian, Krum, RobustAggregation, TrimmedMean
from fl_lightning.robust.attacks import Attack, GaussianUpdate, LabelFlip, ScaledUpdate, SignFlip
from fl_lightning.robust.byzantine import Byzantine, malicious_clients

__all__ = [
    "Attack",
    "Bulyan",
    "Byzantine",
    "CoordinateMedian",
    "GaussianUpdate",
    "Krum",
    "LabelFlip",
    "RobustAggregation",
    "ScaledUpdate",
    "SignFlip",
    "TrimmedMean",
    "malicious_clients",
]
