"""Secure aggregation, simulated: pairwise additive masks in fixed-point integer arithmetic."""

from fl_lightning.secure.secure_aggregation import SecureAggregation

__all__ = ["SecureAggregation"]
