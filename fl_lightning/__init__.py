"""fl_lightning: federated learning research as a first-class citizen of PyTorch Lightning.

The public names load on first use (PEP 562 ``__getattr__``): ``import fl_lightning`` imports none of the
algorithms, models or Lightning itself, and ``from fl_lightning import FedAvg`` imports what ``FedAvg`` needs.
A subpackage is an attribute too (``fl_lightning.algorithms`` after ``import fl_lightning``), imported when read.
"""

from fl_lightning._lazy import lazy_exports
from fl_lightning._moved import install as install_moved_modules
from fl_lightning.utils._quiet import silence_leafspec_warning, silence_lightning_tips

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    "fl_lightning.algorithms": (
        "AllClients", "Algorithm", "AsyncAlgorithm", "ClientContext", "ClientUpdate", "CompressedFedAvg", "Ditto",
        "FedALIGN", "FedAsync", "FedAvg", "FedAvgSM", "FedBN", "FedPer", "LGFedAvg", "FedEM", "FedBuff", "FedMRN",
        "FedMRNS", "FedPM", "FedProx", "FedNova", "QFedAvg", "FedDyn", "SCAFFOLD", "FedSoft", "FedStaleWeight",
        "FlexibleParticipation", "IFCA", "LocalOnly", "PriorityOnly", "ServerAdagrad", "ServerAdam", "ServerSGD",
        "ServerYogi",
    ),
    "fl_lightning.callbacks": ("FederatedCallback", "FederatedEvaluation", "FederatedProgressBar", "TestCurve"),
    "fl_lightning.server.federated_parameters": ("FederatedParameters", "ParameterKinds"),
    "fl_lightning.server.federation": ("FederatedDataSource", "Federation"),
    "fl_lightning.privacy": ("AdaptiveClipping", "DPFedAvg"),
    "fl_lightning.mixins": (
        "LinearTermMixin", "MaskedNoiseMixin", "MixtureWeightedMixin", "ProbabilityMaskMixin", "ProximalMixin",
    ),
    "fl_lightning.robust": ("Bulyan", "CoordinateMedian", "Krum", "TrimmedMean"),
    "fl_lightning.robust.update_bounds": ("MedianNormFilter", "NormClip", "UpdateBound"),
    "fl_lightning.trainer": ("FederatedTrainer",),
})
__version__ = "0.1.0"

# The modules moved by the relayout (issue 31, under [Unreleased] in CHANGELOG.md) still import from their old
# paths, with a DeprecationWarning.
install_moved_modules()
# Lightning's pytree helper warns while a fit runs, not on import.
silence_leafspec_warning()
# Lightning's product tips are logged by every Trainer, whichever way it is built (Python, any LightningCLI).
silence_lightning_tips()
