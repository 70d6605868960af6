"""Client-side behaviour added to any LightningModule."""

from fl_lightning.mixins.linear_term import LinearTermMixin
from fl_lightning.mixins.masked_noise import MaskedNoiseMixin
from fl_lightning.mixins.mixture_weighted import MixtureWeightedMixin
from fl_lightning.mixins.probability_mask import ProbabilityMaskMixin
from fl_lightning.mixins.proximal import ProximalMixin
from fl_lightning.mixins.required import require_mixin

__all__ = [
    "LinearTermMixin",
    "MaskedNoiseMixin",
    "MixtureWeightedMixin",
    "ProbabilityMaskMixin",
    "ProximalMixin",
    "require_mixin",
]
