"""Round-level callbacks: progress, client metrics, federated evaluation, the opt-in test curve, the federated hook contract."""

from fl_lightning.callbacks.client_loss import ClientLossRecorder
from fl_lightning.callbacks.federated_callback import FederatedCallback, call_federated_hook
from fl_lightning.callbacks.federated_evaluation import FederatedEvaluation
from fl_lightning.callbacks.progress import FederatedProgressBar
from fl_lightning.callbacks.test_curve import TestCurve

__all__ = [
    "ClientLossRecorder",
    "FederatedCallback",
    "FederatedEvaluation",
    "FederatedProgressBar",
    "TestCurve",
    "call_federated_hook",
]
