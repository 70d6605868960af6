"""fl_lightning: federated learning research as a first-class citizen of PyTorch Lightning."""

from fl_lightning._moved import install as install_moved_modules
from fl_lightning.utils._quiet import silence_leafspec_warning, silence_lightning_tips
from fl_lightning.algorithms import (
    AllClients,
    Algorithm,
    AsyncAlgorithm,
    ClientContext,
    ClientUpdate,
    CompressedFedAvg,
    Ditto,
    FedALIGN,
    FedAsync,
    FedAvg,
    FedAvgSM,
    FedBN,
    FedPer,
    LGFedAvg,
    FedEM,
    FedBuff,
    FedMRN,
    FedMRNS,
    FedPM,
    FedProx,
    FedNova,
    QFedAvg,
    FedDyn,
    SCAFFOLD,
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
from fl_lightning.callbacks import FederatedCallback, FederatedEvaluation, FederatedProgressBar, TestCurve
from fl_lightning.server.federated_parameters import FederatedParameters, ParameterKinds
from fl_lightning.server.federation import FederatedDataSource, Federation
from fl_lightning.privacy import AdaptiveClipping, DPFedAvg
from fl_lightning.mixins import LinearTermMixin
from fl_lightning.mixins import MaskedNoiseMixin, MixtureWeightedMixin, ProbabilityMaskMixin, ProximalMixin
from fl_lightning.robust import Bulyan, CoordinateMedian, Krum, TrimmedMean
from fl_lightning.trainer import FederatedTrainer
from fl_lightning.robust.update_bounds import MedianNormFilter, NormClip, UpdateBound

# The modules moved in 0.2 still import from their old paths, with a DeprecationWarning.
install_moved_modules()
# Lightning's pytree helper warns while a fit runs, not on import.
silence_leafspec_warning()
# Lightning's product tips are logged by every Trainer, whichever way it is built (Python, any LightningCLI).
silence_lightning_tips()

__version__ = "0.1.0"

__all__ = [
    "AdaptiveClipping",
    "AllClients",
    "Algorithm",
    "AsyncAlgorithm",
    "Bulyan",
    "ClientContext",
    "ClientUpdate",
    "CompressedFedAvg",
    "CoordinateMedian",
    "DPFedAvg",
    "Ditto",
    "FedALIGN",
    "FedAsync",
    "FedAvg",
    "FedAvgSM",
    "FedBN",
    "FedPer",
    "LGFedAvg",
    "FedEM",
    "FedBuff",
    "FedMRN",
    "FedMRNS",
    "FedPM",
    "FedProx",
    "FedNova",
    "QFedAvg",
    "FedDyn",
    "SCAFFOLD",
    "FedSoft",
    "FedStaleWeight",
    "FederatedCallback",
    "FederatedDataSource",
    "FederatedEvaluation",
    "FederatedProgressBar",
    "FederatedTrainer",
    "FlexibleParticipation",
    "FederatedParameters",
    "Federation",
    "ParameterKinds",
    "IFCA",
    "Krum",
    "LocalOnly",
    "LinearTermMixin",
    "MaskedNoiseMixin",
    "MedianNormFilter",
    "NormClip",
    "MixtureWeightedMixin",
    "PriorityOnly",
    "ProbabilityMaskMixin",
    "ProximalMixin",
    "ServerAdagrad",
    "ServerAdam",
    "ServerSGD",
    "ServerYogi",
    "TestCurve",
    "TrimmedMean",
    "UpdateBound",
]
