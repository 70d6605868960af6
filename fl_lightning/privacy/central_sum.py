"""What the central DP mechanisms over a sum of clipped client deltas share (DP-FedAvg, DP-FTRL)."""

from __future__ import annotations

from typing_extensions import override

from fl_lightning.algorithms.shared.summable import can_shard
from fl_lightning.algorithms.shared.wrapper import AlgorithmWrapper
from fl_lightning.privacy.mechanism import DPMechanism
from fl_lightning.robust.update_bounds import UpdateBound


class CentralSumMechanism(DPMechanism, AlgorithmWrapper):
    """A central DP mechanism that clips each client's delta, sums them (sharded over processes: the noise is added
    once, after the all-reduce) and releases noise every round, even one without a usable update."""

    @override
    def check_update_bound(self, bound: UpdateBound) -> None:
        refuse_relative_bound(type(self).__name__, bound)
        super().check_update_bound(bound)

    @property
    @override
    def aggregates_empty_rounds(self) -> bool:
        """Always: a round with no usable update still releases noise (else its absence reveals the round was empty)."""
        return True

    @property
    @override
    def summable(self) -> bool:
        """Over a weighted sum: the clipped sum shards over processes (the noise is added after the all-reduce)."""
        return can_shard(self.inner)


def refuse_relative_bound(owner: str, bound: UpdateBound) -> None:
    """Raises ValueError if ``bound`` decides one client's update from the others' (its sensitivity is then unbounded)."""
    if bound.needs_all_norms:
        raise ValueError(
            f"{owner} bounds each client's influence by clipping to clip_norm, but update_bound={type(bound).__name__}(...) "
            "decides each update from the other clients' norms, so one client can change what happens to the others and "
            "the sensitivity is no longer clip_norm: use NormClip or no update_bound with it."
        )
