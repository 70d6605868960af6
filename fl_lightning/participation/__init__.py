"""Participation models: how many of the :math:`E` requested local steps a client completes.

Pluggable into every algorithm; see :class:`ParticipationModel` for the contract and Ruan et
al., "Towards Flexible Device Participation in Federated Learning" (AISTATS 2021).
"""

from fl_lightning._lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "fl_lightning.participation.participation_model": ("ParticipationModel",),
        "fl_lightning.participation.events": ("Arrival", "Departure", "ObjectiveSchedule", "should_exclude"),
        "fl_lightning.participation.inactivity": ("Inactivity",),
        "fl_lightning.participation.recovery": ("crossing_rounds", "recovery_rounds"),
        "fl_lightning.participation.speed": (
            "ConstantDelay", "DelayGroups", "DelayModel", "ExponentialDelay", "LogNormalDelay", "TraceDelay",
            "UniformDelay",
        ),
        "fl_lightning.participation.steps": ("BinomialSteps", "FixedSteps", "FullParticipation"),
        "fl_lightning.participation.traces": ("PAPER_TRACE_SUBSTITUTE", "TraceParticipation", "percentage_to_steps"),
    },
)
