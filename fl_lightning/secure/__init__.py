"""Secure aggregation, simulated: pairwise additive masks in fixed-point integer arithmetic."""

from fl_lightning._lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "fl_lightning.secure.secure_aggregation": ("SecureAggregation",),
    },
)
