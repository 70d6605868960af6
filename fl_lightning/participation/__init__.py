"""Participation models: how many of the :math:`E` requested local steps a client completes.

Pluggable into every algorithm; see :class:`ParticipationModel` for the contract and Ruan et
al., "Towards Flexible Device Participation in Federated Learning" (AISTATS 2021).
"""

from fl_lightning.participation.participation_model import ParticipationModel
from fl_lightning.participation.events import Arrival, Departure, ObjectiveSchedule, should_exclude
from fl_lightning.participation.inactivity import Inactivity
from fl_lightning.participation.recovery import crossing_rounds, recovery_rounds
from fl_lightning.participation.speed import (
    ConstantDelay,
    DelayGroups,
    DelayModel,
    ExponentialDelay,
    LogNormalDelay,
    TraceDelay,
    UniformDelay,
)
from fl_lightning.participation.steps import BinomialSteps, FixedSteps, FullParticipation
from fl_lightning.participation.traces import PAPER_TRACE_SUBSTITUTE, TraceParticipation, percentage_to_steps

__all__ = [
    "PAPER_TRACE_SUBSTITUTE",
    "Arrival",
    "Departure",
    "ObjectiveSchedule",
    "BinomialSteps",
    "ConstantDelay",
    "DelayGroups",
    "DelayModel",
    "ExponentialDelay",
    "FixedSteps",
    "FullParticipation",
    "Inactivity",
    "LogNormalDelay",
    "ParticipationModel",
    "TraceDelay",
    "TraceParticipation",
    "UniformDelay",
    "crossing_rounds",
    "percentage_to_steps",
    "recovery_rounds",
    "should_exclude",
]
