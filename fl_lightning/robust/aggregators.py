"""Byzantine-robust aggregation as wrappers over a weighted-sum algorithm's server step."""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from torch import Tensor
from typing_extensions import override

from fl_lightning.algorithms.fedavg import FedAvg
from fl_lightning.algorithms.shared.aggregation import accumulator_dtype
from fl_lightning.algorithms.shared.algorithm import Algorithm, ClientUpdate
from fl_lightning.algorithms.shared.combinable import aggregate_with, can_combine, combine_group
from fl_lightning.algorithms.shared.summable import can_shard
from fl_lightning.algorithms.shared.wrapper import AlgorithmWrapper, wrapped
from fl_lightning.server.federation import Federation
from fl_lightning.server.model_state import State
from fl_lightning.privacy.dp_fedavg import DPFedAvg
from fl_lightning.privacy.dp_fedbuff import DPFedBuff
from fl_lightning.privacy.dp_ftrl import DPFTRL
from fl_lightning.robust import rules


class RobustAggregation(AlgorithmWrapper, ABC):
    """Replaces the wrapped algorithm's average of each group of decoded updates by a robust statistic
    (:meth:`combine`) of the flattened updates, then lets it take its server step (its server optimizer).

    The groups are the wrapped algorithm's (:mod:`fl_lightning.algorithms.shared.combinable`): a round's deltas
    for a weighted-sum algorithm (FedAvg, FedProx, their server optimizers), FedMRN's decoded masked-noise
    updates, the members' models of each of FedSoft's centres, each FedBuff/FedStaleWeight buffer (then
    scaled by the buffer's total weight). Everything else (client selection,
    client-side hooks, decoding, evaluation) is the wrapped algorithm's. The statistic needs every
    update of a group at once: over a weighted sum, clients shard over processes by gathering the
    round's decoded updates to every rank (:attr:`gathers_updates`), which all apply the rule. Norm
    bounding, the other defence, is the trainer's ``update_bound`` (:class:`~fl_lightning.NormClip`,
    :class:`~fl_lightning.MedianNormFilter`), which composes with these.

    Args:
        algorithm: the wrapped algorithm (default ``FedAvg(weighting="uniform")``: the statistic replaces its
            weighting, so the default reads no client's sample count, and composes inside
            :class:`~fl_lightning.privacy.LocalDP`).
    """

    def __init__(self, *, algorithm: Algorithm | None = None) -> None:
        super().__init__(algorithm if algorithm is not None else FedAvg(weighting="uniform"))
        _refuse_central_dp(type(self).__name__, self.inner)
        if not can_combine(self.inner):
            raise ValueError(
                f"{type(self).__name__} replaces the average of a group of client updates, but {type(self.inner).__name__} "
                "aggregates otherwise; wrap a synchronous algorithm whose aggregation is a sum of client deltas "
                "(FedAvg, FedProx, their server optimizers), a compressed FedAvg that averages decoded deltas (FedMRN, "
                "FedAvgSM), FedSoft (per centre) or FedBuff/FedStaleWeight (per buffer); put Byzantine or LocalDP "
                "outside the robust rule."
            )

    @abstractmethod
    def combine(self, updates: Tensor) -> Tensor:
        """The aggregate ``(d,)`` of an ``(n, d)`` float64 matrix of flattened updates."""

    @override
    def aggregate(self, round_idx: int, global_state: State, updates: list[ClientUpdate]) -> dict[str, float]:
        return aggregate_with(self.inner, round_idx, global_state, updates, self.combine_states)

    def combine_states(self, payloads: list[State]) -> State:
        """:meth:`combine` of the floating-point tensors of a group of payloads. Integer counters
        (BatchNorm's ``num_batches_tracked``) stay out of the statistic, so they cannot sway Krum's
        distances; they take their coordinate median."""
        floats = [name for name, t in payloads[0].items() if t.is_floating_point()]
        combined = self._unflatten(self.combine(_flatten(payloads, floats)), payloads[0], floats)
        counters = [name for name in payloads[0] if name not in combined]
        if counters:
            combined.update(self._unflatten(rules.coordinate_median(_flatten(payloads, counters)), payloads[0], counters))
        return combined

    @property
    @override
    def summable(self) -> bool:
        """Never: the statistic needs every update of the round at once."""
        return False

    @property
    @override
    def gathers_updates(self) -> bool:
        """Over a weighted sum, clients shard over processes and every rank applies the rule to the gathered updates."""
        return can_shard(self.inner)

    @staticmethod
    def _unflatten(vector: Tensor, like: State, names: list[str]) -> State:
        """``vector`` cut into the shapes of ``like[names]``, in the dtypes weighted sums have (the server step's input)."""
        out, offset = {}, 0
        for name in names:
            t = like[name]
            out[name] = vector[offset : offset + t.numel()].view(t.shape).to(accumulator_dtype(t.dtype))
            offset += t.numel()
        return out


def _refuse_central_dp(rule: str, algorithm: Algorithm) -> None:
    """Raises ValueError if ``algorithm`` (or one it wraps) is central DP (DPFedAvg, DPFedBuff, DPFTRL): a robust statistic of the
    unclipped updates in place of their clipped sum would release far more than the noise was scaled for."""
    for inner in wrapped(algorithm):
        if isinstance(inner, (DPFedAvg, DPFedBuff, DPFTRL)):
            raise ValueError(
                f"{rule} would replace {type(inner).__name__}'s clipped sum by a statistic that depends on every "
                "client's update, so one client could move the release by more than the clip norm the noise is "
                f"scaled to: {rule} and {type(inner).__name__} cannot be combined (use an update_bound=NormClip instead)."
            )


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


class _ByzantineTolerant(RobustAggregation):
    r"""A rule sized by :math:`f`, the Byzantine updates it tolerates per group of :math:`n` expected updates.

    An expected update that does not reach the rule (the loop dropped it as non-finite or rejected it, or
    its client did not report) counts as one of the :math:`f`: a group of :math:`n - d` updates is
    combined with :math:`f' = \max(f - d, 0)`, which keeps the rule's condition (Krum's
    :math:`n > 2f + 2`, Bulyan's :math:`n \ge 4f + 3`) whenever it held for the full group, so one
    attacker within :math:`f` whose update is dropped cannot abort the run. When an honest client
    is the one missing, the rule then tolerates one Byzantine update fewer than configured. When so few
    arrive that even :math:`f' = 0` breaks the condition (2 of 5 for Krum), the round is skipped
    (:meth:`aggregate`): model unchanged, a warning, ``round/robust_skipped = 1``.
    """

    num_byzantine: int
    _group_size: int

    @override
    def setup(self, federation: Federation) -> None:
        super().setup(federation)
        self._group_setting, self._group_size = combine_group(self.inner)
        self.check_group(self._group_setting, self._group_size)

    @abstractmethod
    def check_group(self, setting: str, n: int) -> None:
        """Raises ValueError, naming ``setting``, if a full group of ``n`` updates breaks the rule's condition."""

    def byzantine_in(self, n: int) -> int:
        """:math:`f'`, the Byzantine updates a group of ``n`` may still hold once each missing one counts against :math:`f`."""
        return max(self.num_byzantine - max(self._group_size - n, 0), 0)

    @abstractmethod
    def condition(self, n: int, f: int) -> tuple[bool, str]:
        """Whether ``n`` updates meet the rule's condition for ``f`` Byzantine ones, and the condition's text."""

    @override
    def aggregate(self, round_idx: int, global_state: State, updates: list[ClientUpdate]) -> dict[str, float]:
        """The rule's aggregate, or, when fewer updates arrived than its condition needs (even with each missing one
        counted against :math:`f`), nothing: the round is skipped with a warning naming the rule and the counts, the
        global model and server state stay as they were and ``round/robust_skipped`` is 1."""
        n, f = len(updates), self.byzantine_in(len(updates))
        met, needs = self.condition(n, f)
        if not met and self._group_setting != "clients_per_cluster":  # FedSoft's groups are its centres', not the round
            rank_zero_warn(
                f"Round {round_idx}: {type(self).__name__} needs {needs} updates but {n} of {self._group_size} arrived "
                f"(f={f} after counting the {self._group_size - n} missing against num_byzantine={self.num_byzantine}); "
                "the round is skipped and the global model is unchanged."
            )
            return {"robust_skipped": 1.0}
        return {**super().aggregate(round_idx, global_state, updates), "robust_skipped": 0.0}


class Krum(_ByzantineTolerant):
    """Krum, or Multi-Krum with ``num_selected > 1`` (Blanchard et al. 2017, §4): the mean of the
    ``num_selected`` deltas closest to their :math:`n - f - 2` nearest neighbours. A missing update
    counts against :math:`f` (:class:`_ByzantineTolerant`).

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
    def check_group(self, setting: str, n: int) -> None:
        rules.check_krum(n, self.num_byzantine)

    @override
    def condition(self, n: int, f: int) -> tuple[bool, str]:
        return n > 2 * f + 2, "n > 2f + 2"

    @override
    def combine(self, updates: Tensor) -> Tensor:
        return rules.multi_krum(updates, self.byzantine_in(len(updates)), min(self.num_selected, len(updates)))


class Bulyan(_ByzantineTolerant):
    """Bulyan over Krum (El Mhamdi et al. 2018, Algorithm 1). A missing update counts against :math:`f`
    (:class:`_ByzantineTolerant`).

    Args:
        num_byzantine: :math:`f`; needs :math:`n \\ge 4f + 3` updates per round.
        algorithm: as in :class:`RobustAggregation`.
    """

    def __init__(self, *, num_byzantine: int, algorithm: Algorithm | None = None) -> None:
        self.num_byzantine = _check_byzantine(num_byzantine)
        super().__init__(algorithm=algorithm)

    @override
    def check_group(self, setting: str, n: int) -> None:
        if n < 4 * self.num_byzantine + 3:
            raise ValueError(f"Bulyan needs n >= 4f + 3 updates per group: got {setting}={n} for num_byzantine={self.num_byzantine}.")

    @override
    def condition(self, n: int, f: int) -> tuple[bool, str]:
        return n >= 4 * f + 3, "n >= 4f + 3"

    @override
    def combine(self, updates: Tensor) -> Tensor:
        return rules.bulyan(updates, self.byzantine_in(len(updates)))
