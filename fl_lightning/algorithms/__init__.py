"""Federated algorithms: the server-side logic of each method."""

from fl_lightning.algorithms.aggregation import apply_delta, weighted_average, weighted_sum
from fl_lightning.algorithms.base import Algorithm, ClientContext, ClientUpdate
from fl_lightning.algorithms.fedavg import FedAvg
from fl_lightning.algorithms.fedprox import FedProx
from fl_lightning.algorithms.flexible import FlexibleParticipation, scheme_coefficients
from fl_lightning.algorithms.server_optimizers import (
    ServerAdagrad,
    ServerAdam,
    ServerOptimizer,
    ServerSGD,
    ServerYogi,
)

__all__ = [
    "Algorithm",
    "ClientContext",
    "ClientUpdate",
    "FedAvg",
    "FedProx",
    "FlexibleParticipation",
    "ServerAdagrad",
    "ServerAdam",
    "ServerOptimizer",
    "ServerSGD",
    "ServerYogi",
    "apply_delta",
    "scheme_coefficients",
    "weighted_average",
    "weighted_sum",
]
