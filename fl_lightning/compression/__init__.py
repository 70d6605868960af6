"""Payload codecs with exact byte accounting: FedMRN's 1-bit masks + seed, and the baselines."""

from fl_lightning.compression.codec import Codec, UpdateCodec
from fl_lightning.compression.masked_noise_codec import (
    DEFAULT_ALPHA,
    MaskedNoiseCodec,
    clip_update,
    deterministic_mask,
    generate_noise,
    mask_probability,
    masked_noise,
    progressive_stochastic_mask,
    sample_mask,
)
from fl_lightning.compression.hadamard import fwht
from fl_lightning.compression.probability_mask_codec import (
    ProbabilityMaskCodec,
    bernoulli_mask,
    sample_probability_mask,
    scores_from_probabilities,
    signed_constant_,
)
from fl_lightning.compression.rotation import DriveCodec, EdenCodec, RotatedQuantizationCodec
from fl_lightning.compression.sign import StochasticSignCodec
from fl_lightning.compression.ternary import TernGradCodec
from fl_lightning.compression.topk import TopKCodec
from fl_lightning.compression.wire import WIRE_KEY, Layout, PayloadError, TensorSpec, as_wire, from_wire

__all__ = [
    "DEFAULT_ALPHA",
    "WIRE_KEY",
    "Codec",
    "DriveCodec",
    "EdenCodec",
    "Layout",
    "MaskedNoiseCodec",
    "PayloadError",
    "ProbabilityMaskCodec",
    "RotatedQuantizationCodec",
    "StochasticSignCodec",
    "TensorSpec",
    "TernGradCodec",
    "TopKCodec",
    "UpdateCodec",
    "as_wire",
    "bernoulli_mask",
    "clip_update",
    "deterministic_mask",
    "from_wire",
    "fwht",
    "generate_noise",
    "mask_probability",
    "masked_noise",
    "progressive_stochastic_mask",
    "sample_mask",
    "sample_probability_mask",
    "scores_from_probabilities",
    "signed_constant_",
]
