"""FedStaleWeight (Ma et al.): buffered asynchronous FL with fair aggregation via staleness reweighting."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from fl_lightning.algorithms.shared.algorithm import ClientUpdate
from fl_lightning.algorithms.fedbuff import FedBuff
from fl_lightning.algorithms.shared.staleness import StalenessTracker

Variant = Literal["eq8", "alg1", "aflbench"]


class FedStaleWeight(FedBuff):
    r"""FedBuff whose buffer weights undo the fast clients' advantage (paper §4).

    A client's share of arrivals is :math:`p_i = 1/(b E[\tau_i] + 1)` (eq. 7), so weighting its
    update by :math:`\alpha_i \propto 1/(n p_i) = (b E[\tau_i] + 1)/n` (eq. 8) gives every client
    the same influence; the weights are normalised within each buffer (§4.2.1) and
    :math:`E[\tau_i]` is a per-client moving average of observed staleness
    (:class:`~fl_lightning.algorithms.shared.staleness.StalenessTracker`), recorded for the whole buffer
    before it is read, as in the authors' code.

    The paper states three raw weights; ``variant`` picks one: ``"eq8"`` (default, the derived
    one: equal staleness gives FedBuff's :math:`1/b`), ``"alg1"`` :math:`(\bar\tau + 1)/n`
    (Algorithm 1 as printed) or ``"aflbench"`` :math:`b \bar\tau / n` (the published code; a
    buffer whose weights are all 0 leaves the model unchanged, as there).

    Args:
        variant: raw-weight formula.
        tracker: staleness estimator (default: sliding window of 5).
        **kwargs: :class:`FedBuff` arguments (``staleness_discount`` must stay ``"constant"``).
    """

    def __init__(self, *, variant: Variant = "eq8", tracker: StalenessTracker | None = None, **kwargs: Any) -> None:
        if variant not in ("eq8", "alg1", "aflbench"):
            raise ValueError(f"`variant` must be 'eq8', 'alg1' or 'aflbench', got {variant!r}.")
        if kwargs.get("staleness_discount", "constant") != "constant":
            raise ValueError("FedStaleWeight replaces FedBuff's staleness discount: leave `staleness_discount` constant.")
        super().__init__(**kwargs)
        self.variant: Variant = variant
        self.tracker = tracker if tracker is not None else StalenessTracker()

    def raw_weight(self, estimate: float) -> float:
        """The unnormalised weight of an update whose client has :math:`\\bar\\tau` = ``estimate``."""
        b, n = self.buffer_size, self.federation.num_clients
        if self.variant == "eq8":
            return (b * estimate + 1) / n
        if self.variant == "alg1":
            return (estimate + 1) / n
        return b * estimate / n

    def buffer_weights(self, updates: Sequence[ClientUpdate]) -> list[float]:
        for u in updates:
            self.tracker.record(u.client_id, u.staleness)
        raw = [self.raw_weight(self.tracker.estimate(u.client_id)) for u in updates]
        if self.max_staleness is not None:
            raw = [0.0 if u.staleness > self.max_staleness else r for r, u in zip(raw, updates)]
        total = sum(raw)
        return [r / total for r in raw] if total > 0 else [0.0] * len(raw)

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "tracker": self.tracker.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.check_client_ids(state["tracker"]["count"], "tracker.count")
        self.tracker.load_state_dict(state["tracker"])
