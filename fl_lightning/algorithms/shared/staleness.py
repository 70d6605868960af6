"""Per-client estimate of expected staleness :math:`E[\\tau_i]` (FedStaleWeight, §4.2.1).

The paper keeps "a moving average of previous staleness" without saying which; the default
here is a true sliding window of 5 (the size of afl-bench's window, without its bug of
dropping the newest entry), with an exponential average, the cumulative mean and afl-bench's
window as it runs (bug included, for parity with the paper's Fig. 2) as options.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Literal
from fl_lightning.utils.checks import check_integer, non_negative

TrackerMode = Literal["window", "ema", "cumulative", "aflbench"]


class StalenessTracker:
    """Records each client's staleness at aggregation and returns its running estimate.

    Args:
        mode: ``"window"`` (mean of the last ``window`` values), ``"ema"``
            (:math:`\\bar\\tau \\leftarrow \\beta \\bar\\tau + (1-\\beta)\\tau`, first value taken as is),
            ``"cumulative"`` (mean of all values), or ``"aflbench"``: afl-bench's
            ``StalenessTracker`` as published, which on a full window drops the *newest* value
            before appending (``list.pop()``), so a client's first ``window - 1`` values stay
            forever and only the last slot follows the latest staleness (notes §2.6).
        window: window length for ``"window"`` and ``"aflbench"``.
        beta: smoothing for ``"ema"``, in ``[0, 1)``.
        unseen: estimate for a client with no record yet.
    """

    def __init__(self, mode: TrackerMode = "window", *, window: int = 5, beta: float = 0.9, unseen: float = 0.0) -> None:
        if mode not in ("window", "ema", "cumulative", "aflbench"):
            raise ValueError(f"Staleness tracker `mode` must be 'window', 'ema', 'cumulative' or 'aflbench', got {mode!r}.")
        check_integer("window", window, minimum=1)
        non_negative("unseen", unseen)  # a staleness, counted in model versions
        if not 0 <= beta < 1:
            raise ValueError(f"Staleness EMA `beta` must be in [0, 1), got {beta}.")
        self.mode, self.window, self.beta, self.unseen = mode, window, beta, unseen
        self._values: dict[int, deque[int]] = {}
        self._mean: dict[int, float] = {}
        self._count: dict[int, int] = {}

    def record(self, client: int, staleness: int) -> None:
        """Adds one observed staleness of ``client``."""
        count = self._count.get(client, 0)
        if self.mode in ("window", "aflbench"):
            values = self._values.setdefault(client, deque(maxlen=self.window))
            if self.mode == "aflbench" and len(values) >= self.window:
                values.pop()  # afl-bench's "pop oldest" pops the newest
            values.append(staleness)
            self._mean[client] = sum(values) / len(values)
        elif self.mode == "ema":
            previous = self._mean.get(client)
            self._mean[client] = staleness if previous is None else self.beta * previous + (1 - self.beta) * staleness
        else:
            self._mean[client] = (self._mean.get(client, 0.0) * count + staleness) / (count + 1)
        self._count[client] = count + 1

    def estimate(self, client: int) -> float:
        """:math:`\\bar\\tau_i`, or ``unseen`` for a client never recorded."""
        return self._mean.get(client, self.unseen)

    def state_dict(self) -> dict[str, Any]:
        return {
            "values": {c: list(v) for c, v in self._values.items()},
            "mean": dict(self._mean),
            "count": dict(self._count),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._values = {int(c): deque(v, maxlen=self.window) for c, v in state["values"].items()}
        self._mean = {int(c): float(m) for c, m in state["mean"].items()}
        self._count = {int(c): int(n) for c, n in state["count"].items()}
