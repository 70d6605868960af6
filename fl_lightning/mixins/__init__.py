"""Client-side behaviour added to any LightningModule."""

from fl_lightning.mixins.proximal import ProximalMixin

__all__ = ["ProximalMixin"]
