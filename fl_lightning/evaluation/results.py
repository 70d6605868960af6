"""One client's result in one evaluation round."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ClientEvaluation:
    """One client's held-out metrics in one evaluation round.

    ``accuracy`` is ``None`` when the module's ``sample_metrics`` reports no ``"correct"``;
    the ``personal_*`` fields are ``None`` when the client has no model of its own.
    """

    client_id: int
    num_samples: int
    loss: float
    accuracy: float | None
    personal_loss: float | None = None
    personal_accuracy: float | None = None
