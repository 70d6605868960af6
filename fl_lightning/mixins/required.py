"""The check every algorithm that needs a client-side mixin runs in ``setup``."""

from __future__ import annotations

from torch import nn


def require_mixin(module: nn.Module, mixin: type, algorithm: object) -> None:
    """Raises ``TypeError`` telling how to declare ``module`` if it does not inherit ``mixin``.

    >>> from fl_lightning import FedProx, ProximalMixin
    >>> require_mixin(nn.Linear(2, 1), ProximalMixin, FedProx())
    Traceback (most recent call last):
    ...
    TypeError: FedProx needs a LightningModule that inherits `fl_lightning.ProximalMixin`; got Linear. Declare `class MyModel(ProximalMixin, Linear)`.
    """
    if not isinstance(module, mixin):
        name, module_name = mixin.__name__, type(module).__name__
        raise TypeError(
            f"{type(algorithm).__name__} needs a LightningModule that inherits `fl_lightning.{name}`; "
            f"got {module_name}. Declare `class MyModel({name}, {module_name})`."
        )
