"""Payload codecs with exact byte accounting: FedMRN's 1-bit masks + seed, and the baselines."""

from fl_lightning._lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "fl_lightning.compression.codec": ("Codec", "UpdateCodec"),
        "fl_lightning.compression.masked_noise_codec": (
            "DEFAULT_ALPHA", "MaskedNoiseCodec", "clip_update", "deterministic_mask", "generate_noise",
            "mask_probability", "masked_noise", "progressive_stochastic_mask", "psm_draws", "psm_value",
            "sample_mask",
        ),
        "fl_lightning.compression.hadamard": ("fwht",),
        "fl_lightning.compression.probability_mask_codec": (
            "ProbabilityMaskCodec", "bernoulli_mask", "sample_probability_mask", "scores_from_probabilities",
            "signed_constant_",
        ),
        "fl_lightning.compression.rotation": ("DriveCodec", "EdenCodec", "RotatedQuantizationCodec"),
        "fl_lightning.compression.sign": ("StochasticSignCodec",),
        "fl_lightning.compression.ternary": ("TernGradCodec",),
        "fl_lightning.compression.topk": ("TopKCodec",),
        "fl_lightning.compression.wire": ("WIRE_KEY", "Layout", "PayloadError", "TensorSpec", "as_wire", "from_wire"),
    },
)
