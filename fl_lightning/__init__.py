"""fl_lightning: federated learning research as a first-class citizen of PyTorch Lightning."""

from fl_lightning.algorithms import (
    AllClients,
    Algorithm,
    ClientContext,
    ClientUpdate,
    CompressedFedAvg,
    FedALIGN,
    FedAvg,
    FedAvgSM,
    FedBuff,
    FedMRN,
    FedMRNS,
    FedPM,
    FedProx,
    FedSoft,
    FedStaleWeight,
    FlexibleParticipation,
    IFCA,
    LocalOnly,
    PriorityOnly,
    ServerAdagrad,
    ServerAdam,
    ServerSGD,
    ServerYogi,
)
from fl_lightning.callbacks import FederatedCallback, FederatedProgressBar
from fl_lightning.federation import FederatedDataSource, Federation
from fl_lightning.mixins import MaskedNoiseMixin, ProbabilityMaskMixin, ProximalMixin
from fl_lightning.trainer import FederatedTrainer

__version__ = "0.1.0"

__all__ = [
    "AllClients",
    "Algorithm",
    "ClientContext",
    "ClientUpdate",
    "CompressedFedAvg",
    "FedALIGN",
    "FedAvg",
    "FedAvgSM",
    "FedBuff",
    "FedMRN",
    "FedMRNS",
    "FedPM",
    "FedProx",
    "FedSoft",
    "FedStaleWeight",
    "FederatedCallback",
    "FederatedDataSource",
    "FederatedProgressBar",
    "FederatedTrainer",
    "FlexibleParticipation",
    "Federation",
    "IFCA",
    "LocalOnly",
    "MaskedNoiseMixin",
    "PriorityOnly",
    "ProbabilityMaskMixin",
    "ProximalMixin",
    "ServerAdagrad",
    "ServerAdam",
    "ServerSGD",
    "ServerYogi",
]
