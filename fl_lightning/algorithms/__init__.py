"""Federated algorithms: the server-side logic of each method."""

from fl_lightning._lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "fl_lightning.algorithms.shared.aggregation": ("apply_delta", "weighted_average", "weighted_sum"),
        "fl_lightning.algorithms.shared.asynchronous": ("AsyncAlgorithm",),
        "fl_lightning.algorithms.shared.algorithm": ("Algorithm", "ClientContext", "ClientUpdate"),
        "fl_lightning.algorithms.compressed": ("CompressedFedAvg",),
        "fl_lightning.algorithms.shared.epsilon_schedules": (
            "ConstantEpsilon", "EpsilonSchedule", "LinearEpsilon", "StepEpsilon",
        ),
        "fl_lightning.algorithms.fedalign": ("AllClients", "FedALIGN", "PriorityOnly", "alignment_decision"),
        "fl_lightning.algorithms.fedasync": ("FedAsync", "staleness_weight"),
        "fl_lightning.algorithms.fedavg": ("FedAvg",),
        "fl_lightning.algorithms.fedavg_sm": ("FedAvgSM",),
        "fl_lightning.algorithms.ditto": ("Ditto",),
        "fl_lightning.algorithms.fedbn": ("FedBN",),
        "fl_lightning.algorithms.fedper": ("FedPer", "LGFedAvg"),
        "fl_lightning.algorithms.fedmrn": ("FedMRN", "FedMRNS"),
        "fl_lightning.algorithms.fedpm": ("FedPM",),
        "fl_lightning.algorithms.fedbuff": ("FedBuff",),
        "fl_lightning.algorithms.fedprox": ("FedProx",),
        "fl_lightning.algorithms.fednova": ("FedNova",),
        "fl_lightning.algorithms.qffl": ("QFedAvg",),
        "fl_lightning.algorithms.feddyn": ("FedDyn",),
        "fl_lightning.algorithms.scaffold": ("SCAFFOLD",),
        "fl_lightning.algorithms.fedstaleweight": ("FedStaleWeight",),
        "fl_lightning.algorithms.fedem": ("FedEM",),
        "fl_lightning.algorithms.fedsoft": ("FedSoft",),
        "fl_lightning.algorithms.ifca": ("IFCA",),
        "fl_lightning.algorithms.local_only": ("LocalOnly",),
        "fl_lightning.algorithms.flexible": ("FlexibleParticipation", "scheme_coefficients"),
        "fl_lightning.algorithms.shared.staleness": ("StalenessTracker",),
        "fl_lightning.algorithms.shared.summable": ("SummableAggregation", "SupportsWeightedSum"),
        "fl_lightning.algorithms.shared.server_optimizers": (
            "ServerAdagrad", "ServerAdam", "ServerOptimizer", "ServerSGD", "ServerYogi",
        ),
    },
)
