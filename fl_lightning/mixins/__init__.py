"""Client-side behaviour added to any LightningModule."""

from fl_lightning._lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "fl_lightning.mixins.linear_term": ("LinearTermMixin",),
        "fl_lightning.mixins.masked_noise": ("MaskedNoiseMixin",),
        "fl_lightning.mixins.mixture_weighted": ("MixtureWeightedMixin",),
        "fl_lightning.mixins.probability_mask": ("ProbabilityMaskMixin",),
        "fl_lightning.mixins.proximal": ("ProximalMixin",),
        "fl_lightning.mixins.required": ("require_mixin",),
    },
)
