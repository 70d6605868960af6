"""Round-level callbacks: progress, client metrics, federated evaluation, the federated hook contract."""

from fl_lightning.callbacks.client_loss import ClientLossRecorder
from fl_lightning.callbacks.federated_callback import FederatedCallback, call_federated_hook
from fl_lightning.callbacks.federated_evaluation import FederatedEvaluation
from fl_lightning.callbacks.progress import FederatedProgressBar

__all__ = ["ClientLossRecorder", "FederatedCallback", "FederatedEvaluation", "FederatedProgressBar", "call_federated_hook"]
