"""Byzantine robustness: attacks by a fraction of malicious clients, and robust aggregation against them."""

from fl_lightning._lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "fl_lightning.robust.aggregators": ("Bulyan", "CoordinateMedian", "Krum", "RobustAggregation", "TrimmedMean"),
        "fl_lightning.robust.attacks": ("Attack", "GaussianUpdate", "LabelFlip", "ScaledUpdate", "SignFlip"),
        "fl_lightning.robust.byzantine": ("Byzantine", "malicious_clients"),
    },
)
