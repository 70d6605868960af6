"""Byzantine-robust aggregation as wrappers over a weighted-sum algorithm's server step."""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch
from torch import Tensor
from typing_extensions import override

from fl_lightning.algorithms.shared.aggregation import accumulator_dtype
from fl_lightning.algorithms.shared.base import Algorithm, ClientUpdate
from fl_lightning.algorithms.shared.summable import SupportsWeightedSum
from fl_lightning.algorithms.shared.wrapper import AlgorithmWrapper
from fl_lightning.federation import Federation
from fl_lightning.model_state import State
from fl_lightning.robust import rules


class RobustAggregation(AlgorithmWrapper, ABC):
    """Replaces the wrapped algorithm's weighted mean of client deltas by a robust statistic
    (:meth:`combine`) of the flattened deltas, then lets it apply the result (its server optimizer).

    Everything else (client selection, client-side hooks, decoding, evaluation) is the wrapped
    algorithm's. The statistic needs every update at once, so the clients of a round cannot be
    sharded over processes. Norm bounding, the other defence, is the trainer's
    ``update_bound`` (:class:`~fl_lightning.NormClip`, :class:`~fl_lightning.MedianNormFilter`),
    which composes with these.

    Args:
        algorithm: the wrapped synchronous weighted-sum algorithm (default :class:`FedAvg`).
    """

    def __init__(self, *, algorithm: Algorithm | None = None) -> None:
        super().__init__(algorithm)
        if not (isinstance(self.inner, SupportsWeightedSum) and self.inner.summable) or self.inner.asynchronous:
            raise ValueError(
                f"{type(self).__name__} wraps a synchronous algorithm whose aggregation is a sum of client deltas "
                f"(SummableAggregation: FedAvg, FedProx, their server optimizers); {type(self.inner).__name__} is not."
            )

    @abstractmethod
    def combine(self, updates: Tensor) -> Tensor:
        """The aggregate ``(d,)`` of an ``(n, d)`` float64 matrix of flattened deltas."""

    @override
    def aggregate(self, round_idx: int, global_state: State, updates: list[ClientUpdate]) -> dict[str, float]:
        """Applies :meth:`combine` of the floating-point deltas as the round's delta. Integer counters
        (BatchNorm's ``num_batches_tracked``) stay out of the statistic, so they cannot sway Krum's
        distances; they advance by their coordinate median, rounded."""
        payloads = [u.payload for u in updates]
        floats = [name for name, t in payloads[0].items() if t.is_floating_point()]
        delta = self._unflatten(self.combine(_flatten(payloads, floats)), payloads[0], floats)
        counters = [name for name in payloads[0] if name not in delta]
        if counters:
            delta.update(self._unflatten(rules.coordinate_median(_flatten(payloads, counters)), payloads[0], counters))
        assert isinstance(self.inner, SupportsWeightedSum)
        return self.inner.apply_weighted_sum(round_idx, global_state, delta, 1.0)

    @property
    @override
    def summable(self) -> bool:
        """Never: the statistic needs every update of the round at once."""
        return False

    @staticmethod
    def _unflatten(vector: Tensor, like: State, names: list[str]) -> State:
        """``vector`` cut into the shapes of ``like[names]``, in the dtypes weighted sums have (the server step's input)."""
        out, offset = {}, 0
        for name in names:
            t = like[name]
            out[name] = vector[offset : offset + t.numel()].view(t.shape).to(accumulator_dtype(t.dtype))
            offset += t.numel()
        return out


def _flatten(payloads: list[State], names: list[str]) -> Tensor:
    """The ``(n, d)`` float64 matrix of the ``names`` tensors of each payload, one row per client."""
    return torch.stack([torch.cat([p[name].reshape(-1).double() for name in names]) for p in payloads])


class CoordinateMedian(RobustAggregation):
    """The coordinate-wise median of the deltas (Yin et al. 2018, Def. 1)."""

    @override
    def combine(self, updates: Tensor) -> Tensor:
        return rules.coordinate_median(updates)


class TrimmedMean(RobustAggregation):
    """The coordinate-wise β-trimmed mean of the deltas (Yin et al. 2018, Def. 2).

    Args:
        beta: fraction trimmed at each end, in [0, 0.5).
        algorithm: as in :class:`RobustAggregation`.
    """

    def __init__(self, *, beta: float = 0.1, algorithm: Algorithm | None = None) -> None:
        if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not 0 <= beta < 0.5:
            raise ValueError(f"`beta` must be a number in [0, 0.5), got {beta!r}.")
        super().__init__(algorithm=algorithm)
        self.beta = float(beta)

    @override
    def combine(self, updates: Tensor) -> Tensor:
        return rules.trimmed_mean(updates, self.beta)


def _check_byzantine(num_byzantine: int) -> int:
    if isinstance(num_byzantine, bool) or not isinstance(num_byzantine, int) or num_byzantine < 0:
        raise ValueError(f"`num_byzantine` must be an integer >= 0, got {num_byzantine!r}.")
    return num_byzantine


class Krum(RobustAggregation):
    """Krum, or Multi-Krum with ``num_selected > 1`` (Blanchard et al. 2017, §4): the mean of the
    ``num_selected`` deltas closest to their :math:`n - f - 2` nearest neighbours.

    Args:
        num_byzantine: :math:`f`, Byzantine clients tolerated per round; needs :math:`n > 2f + 2`.
        num_selected: :math:`m \\ge 1` deltas averaged (1: Krum).
        algorithm: as in :class:`RobustAggregation`.
    """

    def __init__(self, *, num_byzantine: int, num_selected: int = 1, algorithm: Algorithm | None = None) -> None:
        self.num_byzantine = _check_byzantine(num_byzantine)
        if isinstance(num_selected, bool) or not isinstance(num_selected, int) or num_selected < 1:
            raise ValueError(f"`num_selected` must be an integer >= 1, got {num_selected!r}.")
        super().__init__(algorithm=algorithm)
        self.num_selected = num_selected

    @override
    def setup(self, federation: Federation) -> None:
        rules.check_krum(federation.clients_per_round, self.num_byzantine)
        super().setup(federation)

    @override
    def combine(self, updates: Tensor) -> Tensor:
        return rules.multi_krum(updates, self.num_byzantine, min(self.num_selected, len(updates)))


class Bulyan(RobustAggregation):
    """Bulyan over Krum (El Mhamdi et al. 2018, Algorithm 1).

    Args:
        num_byzantine: :math:`f`; needs :math:`n \\ge 4f + 3` updates per round.
        algorithm: as in :class:`RobustAggregation`.
    """

    def __init__(self, *, num_byzantine: int, algorithm: Algorithm | None = None) -> None:
        self.num_byzantine = _check_byzantine(num_byzantine)
        super().__init__(algorithm=algorithm)

    @override
    def setup(self, federation: Federation) -> None:
        if federation.clients_per_round < 4 * self.num_byzantine + 3:
            raise ValueError(
                f"Bulyan needs n >= 4f + 3 clients per round: got clients_per_round={federation.clients_per_round} "
                f"for num_byzantine={self.num_byzantine}."
            )
        super().setup(federation)

    @override
    def combine(self, updates: Tensor) -> Tensor:
        return rules.bulyan(updates, self.num_byzantine)
