r"""Participation models defined directly on the number of completed steps :math:`s_\tau^k`."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from typing_extensions import override

from fl_lightning.participation._participation_checks import check_int, check_probabilities, per_client
from fl_lightning.participation.participation_model import ParticipationModel


class FullParticipation(ParticipationModel):
    r"""Every client completes every requested step, :math:`s_\tau^k = E`: plain FedAvg.

    >>> model = FullParticipation()
    >>> model.setup(num_clients=2, seed=0)
    >>> model.completed_steps(1, round_idx=3, requested=5)
    5
    """

    @override
    def _completed_steps(self, client: int, round_idx: int, requested: int) -> int:
        return requested


class FixedSteps(ParticipationModel):
    r"""Client :math:`k` completes exactly ``steps[k]`` steps every round (for tests).

    Args:
        steps: One non-negative step count per client, or one count for all clients.
            ``completed_steps`` raises ``ValueError`` when a client's count exceeds :math:`E`,
            rather than silently clipping a test's intended schedule.

    >>> model = FixedSteps([3, 0, 5])
    >>> model.setup(num_clients=3, seed=0)
    >>> [model.completed_steps(k, round_idx=0, requested=5) for k in range(3)]
    [3, 0, 5]
    """

    def __init__(self, steps: int | Sequence[int]) -> None:
        if isinstance(steps, Sequence):
            if len(steps) == 0:
                raise ValueError("`steps` must be a step count or a non-empty per-client sequence, got [].")
            self.steps: int | tuple[int, ...] = tuple(
                check_int(f"steps[{client}]", s, minimum=0) for client, s in enumerate(steps)
            )
        else:
            self.steps = check_int("steps", steps, minimum=0)
        self._per_client: tuple[int, ...] = ()

    @override
    def _setup(self, num_clients: int) -> None:
        self._per_client = per_client(type(self).__name__, "steps", self.steps, num_clients)

    @override
    def _completed_steps(self, client: int, round_idx: int, requested: int) -> int:
        steps = self._per_client[client]
        if steps > requested:
            raise ValueError(
                f"FixedSteps: client {client} has steps={steps} > requested E={requested} "
                f"(steps={list(self._per_client)})."
            )
        return steps


class BinomialSteps(ParticipationModel):
    r"""Each of the :math:`E` steps is completed independently with probability :math:`q_k`.

    This is the per-step Bernoulli view of Ruan et al. (2021, App. A.1.1): indicators
    :math:`\alpha_t^k \overset{iid}{\sim} \mathrm{Bernoulli}(q_k)` for the :math:`E` steps of
    the round, and

    .. math:: s_\tau^k = \sum_{i=0}^{E-1} \alpha_{\tau E + i}^k \sim \mathrm{Bin}(E, q_k),

    so a client is inactive (:math:`s = 0`) with probability :math:`(1 - q_k)^E`. The
    :math:`E` indicators are drawn literally, from ``(seed, "participation", round, client)``.

    Args:
        probability: :math:`q_k` in :math:`[0, 1]`, one for all clients or one per client
            (heterogeneous devices).

    >>> model = BinomialSteps([0.0, 1.0])
    >>> model.setup(num_clients=2, seed=0)
    >>> [model.completed_steps(k, round_idx=0, requested=4) for k in range(2)]
    [0, 4]
    """

    def __init__(self, probability: float | Sequence[float]) -> None:
        self.probability = check_probabilities("probability", probability)
        self._per_client: tuple[float, ...] = ()

    @override
    def _setup(self, num_clients: int) -> None:
        self._per_client = per_client(type(self).__name__, "probability", self.probability, num_clients)

    @override
    def _completed_steps(self, client: int, round_idx: int, requested: int) -> int:
        generator = self._generator("participation", round_idx, client)
        alpha = torch.rand(requested, generator=generator, dtype=torch.float64) < self._per_client[client]
        return int(alpha.sum())
