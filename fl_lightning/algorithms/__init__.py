"""Federated algorithms: the server-side logic of each method."""

from fl_lightning.algorithms.shared.aggregation import apply_delta, weighted_average, weighted_sum
from fl_lightning.algorithms.shared.asynchronous import AsyncAlgorithm
from fl_lightning.algorithms.shared.algorithm import Algorithm, ClientContext, ClientUpdate
from fl_lightning.algorithms.compressed import CompressedFedAvg
from fl_lightning.algorithms.shared.epsilon_schedules import ConstantEpsilon, EpsilonSchedule, LinearEpsilon, StepEpsilon
from fl_lightning.algorithms.fedalign import AllClients, FedALIGN, PriorityOnly, alignment_decision
from fl_lightning.algorithms.fedasync import FedAsync, staleness_weight
from fl_lightning.algorithms.fedavg import FedAvg
from fl_lightning.algorithms.fedavg_sm import FedAvgSM
from fl_lightning.algorithms.ditto import Ditto
from fl_lightning.algorithms.fedbn import FedBN
from fl_lightning.algorithms.fedper import FedPer, LGFedAvg
from fl_lightning.algorithms.fedmrn import FedMRN, FedMRNS
from fl_lightning.algorithms.fedpm import FedPM
from fl_lightning.algorithms.fedbuff import FedBuff
from fl_lightning.algorithms.fedprox import FedProx
from fl_lightning.algorithms.fednova import FedNova
from fl_lightning.algorithms.qffl import QFedAvg
from fl_lightning.algorithms.feddyn import FedDyn
from fl_lightning.algorithms.scaffold import SCAFFOLD
from fl_lightning.algorithms.fedstaleweight import FedStaleWeight
from fl_lightning.algorithms.fedem import FedEM
from fl_lightning.algorithms.fedsoft import FedSoft
from fl_lightning.algorithms.ifca import IFCA
from fl_lightning.algorithms.local_only import LocalOnly
from fl_lightning.algorithms.flexible import FlexibleParticipation, scheme_coefficients
from fl_lightning.algorithms.shared.staleness import StalenessTracker
from fl_lightning.algorithms.shared.summable import SummableAggregation, SupportsWeightedSum
from fl_lightning.algorithms.shared.server_optimizers import (
    ServerAdagrad,
    ServerAdam,
    ServerOptimizer,
    ServerSGD,
    ServerYogi,
)

__all__ = [
    "AllClients",
    "Algorithm",
    "AsyncAlgorithm",
    "ClientContext",
    "ClientUpdate",
    "CompressedFedAvg",
    "Ditto",
    "ConstantEpsilon",
    "EpsilonSchedule",
    "FedALIGN",
    "FedAsync",
    "FedAvg",
    "FedAvgSM",
    "FedBN",
    "FedPer",
    "LGFedAvg",
    "FedBuff",
    "FedMRN",
    "FedMRNS",
    "FedPM",
    "FedProx",
    "FedNova",
    "QFedAvg",
    "FedDyn",
    "SCAFFOLD",
    "FedStaleWeight",
    "FedEM",
    "FedSoft",
    "FlexibleParticipation",
    "IFCA",
    "LinearEpsilon",
    "LocalOnly",
    "PriorityOnly",
    "ServerAdagrad",
    "ServerAdam",
    "ServerOptimizer",
    "ServerSGD",
    "ServerYogi",
    "StalenessTracker",
    "SummableAggregation",
    "SupportsWeightedSum",
    "StepEpsilon",
    "alignment_decision",
    "apply_delta",
    "scheme_coefficients",
    "staleness_weight",
    "weighted_average",
    "weighted_sum",
]
