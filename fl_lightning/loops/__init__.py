"""Federated fit loops."""

from fl_lightning._lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "fl_lightning.loops.async_fit_loop": ("AsyncFitLoop",),
        "fl_lightning.loops.federated_fit_loop": ("FederatedFitLoop",),
    },
)
