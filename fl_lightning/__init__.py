"""fl_lightning: federated learning research as a first-class citizen of PyTorch Lightning."""

from fl_lightning.algorithms import (
    Algorithm,
    ClientContext,
    ClientUpdate,
    FedAvg,
    FedProx,
    FlexibleParticipation,
    ServerAdagrad,
    ServerAdam,
    ServerSGD,
    ServerYogi,
)
from fl_lightning.callbacks import FederatedCallback, FederatedProgressBar
from fl_lightning.federation import FederatedDataSource, Federation
from fl_lightning.mixins import ProximalMixin
from fl_lightning.trainer import FederatedTrainer

__version__ = "0.1.0"

__all__ = [
    "Algorithm",
    "ClientContext",
    "ClientUpdate",
    "FedAvg",
    "FedProx",
    "FederatedCallback",
    "FederatedDataSource",
    "FederatedProgressBar",
    "FederatedTrainer",
    "FlexibleParticipation",
    "Federation",
    "ProximalMixin",
    "ServerAdagrad",
    "ServerAdam",
    "ServerSGD",
    "ServerYogi",
]
