r"""Inactivity (:math:`s_\tau^k = 0`) layered on any participation model."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from typing_extensions import override

from fl_lightning.participation._participation_checks import check_probabilities, per_client
from fl_lightning.participation.participation_model import ParticipationModel


class Inactivity(ParticipationModel):
    r"""Client :math:`k` is inactive with probability :math:`q_k` each round, else ``base`` decides.

    .. math::
        s_\tau^k = \begin{cases} 0 & \text{with probability } q_k, \\
        s_\tau^{k,\mathrm{base}} & \text{otherwise.} \end{cases}

    Ruan et al. (2021, Section 3.1) have no separate activity parameter: inactivity is
    :math:`s = 0`, and any model may produce it. This wrapper adds it explicitly, on its own
    stream ``(seed, "inactivity", round, client)``, independent of the base model's draws, so
    an active client completes exactly the steps the unwrapped ``base`` would give it.

    Nested ``Inactivity`` wrappers share that stream (and so are not independent): the
    combined rate is :math:`\max(q, q')`, not :math:`1 - (1-q)(1-q')`. Use one wrapper with
    the combined probability instead.

    Args:
        base: The model for active rounds; set up with the same ``num_clients`` and ``seed``.
        probability: :math:`q_k` in :math:`[0, 1]`, one for all clients or one per client.

    >>> from fl_lightning.participation import FullParticipation
    >>> model = Inactivity(FullParticipation(), probability=[0.0, 1.0])
    >>> model.setup(num_clients=2, seed=0)
    >>> [model.completed_steps(k, round_idx=0, requested=5) for k in range(2)]
    [5, 0]
    """

    def __init__(self, base: ParticipationModel, probability: float | Sequence[float]) -> None:
        if not isinstance(base, ParticipationModel):
            raise TypeError(f"`base` must be a ParticipationModel, got {type(base).__name__}.")
        self.base = base
        self.probability = check_probabilities("probability", probability)
        self._per_client: tuple[float, ...] = ()

    @override
    def _setup(self, num_clients: int) -> None:
        self._per_client = per_client(type(self).__name__, "probability", self.probability, num_clients)
        self.base.setup(num_clients=num_clients, seed=self._seed)

    @override
    def _completed_steps(self, client: int, round_idx: int, requested: int) -> int:
        if self._uniform("inactivity", round_idx, client) < self._per_client[client]:
            return 0
        return self.base.completed_steps(client, round_idx, requested)

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"base": self.base.state_dict()}

    @override
    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.base.load_state_dict(state.get("base", {}))
