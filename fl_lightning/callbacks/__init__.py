"""Round-level callbacks: progress, client metrics, federated evaluation, the opt-in test curve, the federated hook contract."""

from fl_lightning._lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "fl_lightning.callbacks.client_loss": ("ClientLossRecorder",),
        "fl_lightning.callbacks.federated_callback": ("FederatedCallback", "call_federated_hook"),
        "fl_lightning.callbacks.federated_evaluation": ("FederatedEvaluation",),
        "fl_lightning.callbacks.progress": ("FederatedProgressBar",),
        "fl_lightning.callbacks.test_curve": ("TestCurve",),
    },
)
