r"""FedMRN's "FedAvg w. SM" ablation (Li et al., ACM MM 2024, §5.4 / Fig. 4): post-training masking."""

from __future__ import annotations

from typing import Literal

import lightning.pytorch as pl
from typing_extensions import override

from fl_lightning.algorithms.shared.algorithm import ClientContext
from fl_lightning.algorithms.compressed import CompressedFedAvg
from fl_lightning.algorithms.fedmrn import final_mask_seed, masked_noise_seed
from fl_lightning.algorithms.shared.server_optimizers import ServerOptimizer
from fl_lightning.compression.masked_noise_codec import MaskedNoiseCodec, MaskType, NoiseType, sample_mask
from fl_lightning.compression.wire import device_generator
from fl_lightning.server.model_state import State


class FedAvgSM(CompressedFedAvg):
    r"""FedAvg with stochastic masking over seeded random noise applied *after* local training.

    The paper's "FedAvg w. SM" (§5.4, Fig. 4): the client trains its weights as in FedAvg, then
    maps its final update :math:`u = w_k - w^t` to masked noise with stochastic masking (eq. 6
    binary / eq. 7 signed) over the same seeded noise :math:`n = G(s_k^t)` as FedMRN, and uploads
    the seed and :math:`m = \mathcal{M}(u, n)`. The server applies eq. 5 as FedMRN does. It
    differs from ``FedMRN(progressive=False)`` ("FedMRN w.o. PM") only in the timing of the
    masking: after local training instead of at every local step. No mixin is needed.

    Seeds are FedMRN's: the noise seed, and the final mask draw's generator, come from
    ``(client seed, "masked_noise", "noise" | "mask")``, so both ablations share :math:`G(s)`.
    Tensors that are not masked (biases, BatchNorm) are sent in full precision.

    Args:
        mask: ``"binary"`` (FedMRN's masks) or ``"signed"`` (FedMRNS's).
        noise: ``"uniform"`` (default), ``"gaussian"`` or ``"bernoulli"``.
        alpha: noise magnitude :math:`\alpha` (default 1e-2 binary, 5e-3 signed).
        server_optimizer: as in :class:`~fl_lightning.FedAvg`.
        weighting: as in :class:`~fl_lightning.FedAvg`.
    """

    codec: MaskedNoiseCodec

    def __init__(
        self,
        *,
        mask: MaskType = "binary",
        noise: NoiseType = "uniform",
        alpha: float | None = None,
        server_optimizer: ServerOptimizer | None = None,
        weighting: Literal["samples", "uniform"] = "samples",
    ) -> None:
        codec = MaskedNoiseCodec(mask=mask, noise=noise, alpha=alpha)
        super().__init__(codec=codec, server_optimizer=server_optimizer, weighting=weighting)

    @override
    def encode(self, client: ClientContext, module: pl.LightningModule, delta: State) -> bytes:
        seed = masked_noise_seed(client)
        noise = self.codec.noise(seed, self.layout, device=module.device)
        generator = device_generator(final_mask_seed(client), module.device)
        # One draw per masked tensor, in layout order, from one generator (as FedMRN's final mask).
        bits = {
            spec.name: sample_mask(delta[spec.name], noise[spec.name], self.codec.mask, generator)
            for spec in self.layout.compressed
        }
        return self.codec.encode(seed, bits, delta, self.layout)
