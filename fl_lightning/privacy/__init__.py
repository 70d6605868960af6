"""Differential privacy for federated training: DP-FedAvg (and over asynchronous buffers), DP-FTRL, adaptive clipping, local DP, privacy accounting."""

from fl_lightning._lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "fl_lightning.privacy.accountant": ("RoundAccountant", "gaussian_epsilon"),
        "fl_lightning.privacy.adaptive_clipping": ("AdaptiveClipping",),
        "fl_lightning.privacy.dp_fedavg": ("DPFedAvg",),
        "fl_lightning.privacy.dp_fedbuff": ("DPFedBuff",),
        "fl_lightning.privacy.dp_ftrl": ("DPFTRL",),
        "fl_lightning.privacy.local_dp": ("LocalDP",),
    },
)
