r"""FedMRN (Li et al., "Masked Random Noise for Communication-Efficient Federated Learning", ACM MM 2024)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, ClassVar, Literal

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_warn

from fl_lightning.algorithms.shared.algorithm import ClientContext
from fl_lightning.algorithms.compressed import CompressedFedAvg
from fl_lightning.algorithms.shared.server_optimizers import ServerOptimizer
from fl_lightning.compression.masked_noise_codec import MaskedNoiseCodec, MaskType, NoiseType
from fl_lightning.compression.wire import Layout, TensorSpec, device_generator
from fl_lightning.server.federation import Federation
from fl_lightning.mixins.required import require_mixin
from fl_lightning.mixins.masked_noise import MaskedNoiseMixin
from fl_lightning.server.model_state import State
from fl_lightning.utils.seeding import derive_seed


def masked_noise_seed(client: ClientContext) -> int:
    """The client's noise seed :math:`s_k^t` for the round (shared by FedMRN and FedAvg w. SM)."""
    return derive_seed(client.seed, "masked_noise", "noise")


def final_mask_seed(client: ClientContext) -> int:
    """Seed of the generator of the client's uploaded mask draw :math:`m = \\mathcal{M}(u, n)`."""
    return derive_seed(client.seed, "masked_noise", "mask")


#: Below this fraction of the shared values masked, FedMRN warns: most of an upload is full precision.
MOST_OF_THE_MODEL = 0.5
#: Names listed in the set-up report, per group; the rest are counted.
_LISTED = 8


def report_masking(algorithm: str, layout: Layout) -> None:
    """Says at set-up which tensors go up as 1-bit masks and which in full precision, and warns when
    less than most of the shared values (:data:`MOST_OF_THE_MODEL`) are masked."""
    dense = [spec for spec in layout.dense if spec.dtype.is_floating_point]  # integer counters are not "the model"
    masked_values, dense_values = sum(s.numel for s in layout.compressed), sum(s.numel for s in dense)
    fraction = masked_values / max(masked_values + dense_values, 1)
    rank_zero_info(
        f"{algorithm} masks {len(layout.compressed)} tensors ({masked_values:,} values, {fraction:.1%} of the shared ones): "
        f"{_listed(layout.compressed)}; in full precision: {_listed(dense) or 'nothing'} ({dense_values:,} values)."
    )
    if fraction < MOST_OF_THE_MODEL:
        # 1 bit per masked value against 32 per value under FedAvg (headers and seeds aside).
        ratio = 32 * (masked_values + dense_values) / (masked_values + 32 * dense_values)
        rank_zero_warn(
            f"{algorithm} masks only {fraction:.1%} of the shared (sent) values ({_listed(layout.compressed)}); the rest "
            f"go up in full precision, so an upload is about {ratio:.1f}x smaller than FedAvg's, not ~32x. Override the "
            "module's maskable_parameter_names() to mask more of the shared tensors (frozen ones are never sent)."
        )


def _listed(specs: Sequence[TensorSpec]) -> str:
    names = ", ".join(spec.name for spec in specs[:_LISTED])
    return names + (f" and {len(specs) - _LISTED} more" if len(specs) > _LISTED else "")


class FedMRN(CompressedFedAvg):
    r"""Federated Masked Random Noise: clients learn 1-bit masks over seeded noise (Algorithm 1).

    Client :math:`k` in round :math:`t`: seed :math:`s_k^t`, noise :math:`n = G(s_k^t)`, latent
    update :math:`u = 0`; :math:`S` local steps on :math:`F_k(w^t + \hat u)` with progressive
    stochastic masking (eq. 6-10, :class:`~fl_lightning.mixins.MaskedNoiseMixin`); upload of the
    seed and the final masks :math:`m_k^t = \mathcal{M}(u, n)` (:class:`MaskedNoiseCodec`).
    Server (eq. 5):

    .. math:: w^{t+1} = w^t + \frac{\sum_k p_k\, G(s_k^t) \odot m_k^t}{\sum_k p_k}

    with :math:`p_k` the client's sample count (:class:`~fl_lightning.algorithms.fedavg_sm.FedAvgSM` is the
    paper's post-training-masking ablation "FedAvg w. SM"); tensors that are not masked (BatchNorm affine
    and statistics, biases) are sent in full precision and FedAvg-averaged. The masked tensors are the
    module's ``maskable_parameter_names()`` (by default every trainable Linear, convolution, Embedding and
    recurrent weight, a tied one once); only shared tensors are sent, so a frozen base is never masked
    (``federated_parameters``). The set-up says which go up masked and which in full precision, and warns when
    less than half of the shared values are masked.

    Choices where the paper is silent: the seed is derived from ``(run seed, round, client)`` but
    still uploaded (8 bytes) and read back by the server; the mask draws during training and
    the final mask come from generators seeded by the client's seed; :math:`S` is the client's
    optimizer-step count this round (``local_steps``, or local epochs × batches divided by
    ``accumulate_grad_batches``); the server optimizer (default plain SGD, lr 1) applies the
    average as in FedAvg.

    Args:
        mask: ``"binary"`` (FedMRN) or ``"signed"`` (FedMRNS, see :class:`FedMRNS`).
        noise: ``"uniform"`` (default), ``"gaussian"`` or ``"bernoulli"``.
        alpha: noise magnitude :math:`\alpha` (default 1e-2 binary, 5e-3 signed).
        stochastic: stochastic masking; ``False`` is the deterministic-masking ablation.
        progressive: progressive masking; ``False`` is the SM-only ablation.
        server_optimizer: as in :class:`~fl_lightning.FedAvg`.
        weighting: as in :class:`~fl_lightning.FedAvg`.
    """

    codec: MaskedNoiseCodec

    #: Its configure_client sets the masked-noise term only: the batched executor stacks each client's u and n and
    #: draws each step's masks from each client's own generator (:meth:`MaskedNoiseMixin.step_tensors`).
    configure_client_sets_terms: ClassVar[bool] = True

    def __init__(
        self,
        *,
        mask: MaskType = "binary",
        noise: NoiseType = "uniform",
        alpha: float | None = None,
        stochastic: bool = True,
        progressive: bool = True,
        server_optimizer: ServerOptimizer | None = None,
        weighting: Literal["samples", "uniform"] = "samples",
    ) -> None:
        codec = MaskedNoiseCodec(mask=mask, noise=noise, alpha=alpha)
        super().__init__(codec=codec, server_optimizer=server_optimizer, weighting=weighting)
        self.stochastic, self.progressive = stochastic, progressive

    def setup(self, federation: Federation) -> None:
        module = federation.module
        require_mixin(module, MaskedNoiseMixin, self)
        module.install_masked_noise()  # type: ignore[attr-defined]
        super().setup(federation)
        report_masking(type(self).__name__, self.layout)

    def compressible_names(self, module: pl.LightningModule) -> list[str]:
        return module.masked_parameter_names  # type: ignore[attr-defined,no-any-return]

    def noise_seed(self, client: ClientContext) -> int:
        """The client's seed :math:`s_k^t` for the round."""
        return masked_noise_seed(client)

    def local_steps(self, client: ClientContext) -> int:
        """:math:`S`: the optimizer steps the loop will run for ``client`` (at least 1)."""
        if client.num_steps is not None:
            return max(client.num_steps, 1)
        batches = self.federation.data.client_batches(client.client_id, num_epochs=client.num_epochs, generator=torch.Generator())
        return max(math.ceil(len(batches) / self.federation.services.accumulate_grad_batches), 1)  # type: ignore[arg-type]

    def configure_client(self, client: ClientContext, module: pl.LightningModule, global_state: State) -> None:
        device = module.device
        module.begin_masked_noise_round(  # type: ignore[attr-defined]
            self.codec.noise(self.noise_seed(client), self.layout, device=device),
            total_steps=self.local_steps(client),
            mask=self.codec.mask,
            stochastic=self.stochastic,
            progressive=self.progressive,
            generator=device_generator(derive_seed(client.seed, "masked_noise", "psm"), device),
        )

    def encode(self, client: ClientContext, module: pl.LightningModule, delta: State) -> bytes:
        final = device_generator(final_mask_seed(client), module.device)
        bits = module.end_masked_noise_round(final)  # type: ignore[attr-defined]
        return self.codec.encode(self.noise_seed(client), bits, delta, self.layout)


class FedMRNS(FedMRN):
    """FedMRN with signed masks :math:`m \\in \\{-1, +1\\}^d` (eq. 7) and :math:`\\alpha` = 5e-3 by default.

    Differs from :class:`FedMRN` only in the default ``mask="signed"``; other arguments are FedMRN's.
    """

    def __init__(self, *, mask: MaskType = "signed", **kwargs: Any) -> None:
        super().__init__(mask=mask, **kwargs)
