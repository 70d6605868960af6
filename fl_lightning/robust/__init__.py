"""Byzantine robustness: robust aggregation rules and the wrappers that apply them."""

from fl_lightning.robust.aggregators import Bulyan, CoordinateMedian, Krum, RobustAggregation, TrimmedMean

__all__ = ["Bulyan", "CoordinateMedian", "Krum", "RobustAggregation", "TrimmedMean"]
