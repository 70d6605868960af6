r"""FedPM (Isik et al., "Sparse Random Networks for Communication-Efficient Federated Learning",
ICLR 2023), the probability-mask baseline of FedMRN (Li et al., ACM MM 2024)."""

from __future__ import annotations

from dataclasses import replace
from typing import ClassVar, Literal

import lightning.pytorch as pl
import torch

from fl_lightning.algorithms.shared.aggregation import weighted_average
from fl_lightning.algorithms.shared.algorithm import ClientContext, ClientUpdate
from fl_lightning.algorithms.compressed import CompressedFedAvg
from fl_lightning.algorithms.shared.server_optimizers import ServerOptimizer
from fl_lightning.compression.probability_mask_codec import (
    DEFAULT_EPS,
    ProbabilityMaskCodec,
    check_eps,
)
from fl_lightning.compression.wire import device_generator
from fl_lightning.server.federation import Federation
from fl_lightning.mixins.required import require_mixin
from fl_lightning.mixins.probability_mask import (
    WEIGHT_INITS,
    ProbabilityMaskMixin,
    WeightInit,
)
from fl_lightning.server.model_state import State
from fl_lightning.utils.seeding import derive_seed


class FedPM(CompressedFedAvg):
    r"""Federated Probabilistic Masks: clients train Bernoulli masks over frozen random weights
    and upload one sampled mask bit per weight.

    Client :math:`k` in round :math:`t` receives :math:`\theta^t`, sets its scores to
    :math:`s = \mathrm{sigmoid}^{-1}(\mathrm{clip}(\theta^t, \epsilon, 1 - \epsilon))`, trains them
    through the effective weights :math:`w \odot m`, :math:`m \sim \mathrm{Bern}(\mathrm{sigmoid}(s))`
    (straight-through, :class:`~fl_lightning.mixins.ProbabilityMaskMixin`), and uploads
    :math:`m_k^t \sim \mathrm{Bern}(\mathrm{sigmoid}(s_k))` (:class:`ProbabilityMaskCodec`). Server
    (Li et al. 2024 §2.2, FedPM's rule :math:`s^{t+1} = \mathrm{sigmoid}^{-1}[\frac1K \sum_k m_k^t]`):

    .. math:: \theta^{t+1} = \frac{\sum_k p_k\, m_k^t}{\sum_k p_k}, \qquad p_k = 1 \text{ by default}

    Tensors that are not masked (biases, BatchNorm) train normally, are sent in full precision and
    are FedAvg-averaged with the same weights :math:`p_k` and the server optimizer.

    Choices where the FedMRN paper is silent (following the FedPM authors' public code):

    - **Aggregation**: the plain average above. FedPM's Bayesian aggregation with its Beta prior
      reset every round (as the authors' code does) is this average; :math:`\theta^{t+1}` is kept
      exact and the clip by :math:`\epsilon = 0.01` is applied by clients when they form scores
      (the authors map uploaded bits to :math:`\epsilon, 1 - \epsilon`).
    - **Random network**: masked weights are frozen at :math:`\pm e/\sqrt{\mathrm{fan\_in}}`
      (the authors' ``ME_init``) drawn from ``derive_seed(run seed, "fedpm")``; ``weight_init="module"``
      keeps the module's initialisation. :math:`\theta^0 = 1/2`. The authors also mask frozen random
      biases; here biases are ordinary trained tensors.
    - **Masks**: a fresh draw in every training forward pass (as the authors' masked layers), then
      one more draw to upload, from generators seeded by the client's seed.
    - **Evaluation**: a sampled mask (as the authors evaluate), :math:`m = \mathbb{1}[U < \theta]`
      with :math:`U` uniform draws fixed by the run seed, so validation is deterministic.
    - **Optimizer**: the module's. The FedMRN paper trains every method with plain SGD; the FedPM
      authors train the scores with Adam (lr 0.1), under which they learn much faster (our configs
      and benchmark use Adam for FedPM).
    - **Bytes**: the upload is the payload's length; the download is 4 bytes per element of
      :math:`\theta` and of every unmasked tensor (the frozen weights are rebuilt from the seed).

    Besides :class:`CompressedFedAvg`'s metrics, logs ``round/mask_density``: the mean of :math:`\theta`.

    Args:
        eps: clip of :math:`\theta` before the logit, in (0, 0.5).
        weight_init: ``"signed_constant"`` (default) or ``"module"``.
        server_optimizer: applied to the unmasked tensors, as in :class:`~fl_lightning.FedAvg`.
        weighting: :math:`p_k`: ``"uniform"`` (default, the paper's :math:`1/K`) or ``"samples"``.
    """

    codec: ProbabilityMaskCodec
    batched_refusal: ClassVar[str] = (
        "ProbabilityMaskMixin samples the Bernoulli masks in every forward pass from the generator configure_client "
        "sets on the module for the client, one module-wide generator that a group's clients would share, so their "
        "masks could not be drawn as each one alone draws them (only MaskedNoiseMixin's are drawn per client)."
    )

    def __init__(
        self,
        *,
        eps: float = DEFAULT_EPS,
        weight_init: WeightInit = "signed_constant",
        server_optimizer: ServerOptimizer | None = None,
        weighting: Literal["samples", "uniform"] = "uniform",
    ) -> None:
        if weight_init not in WEIGHT_INITS:
            raise ValueError(f"`weight_init` must be one of {WEIGHT_INITS}, got {weight_init!r}.")
        super().__init__(
            codec=ProbabilityMaskCodec(),
            server_optimizer=server_optimizer,
            weighting=weighting,
        )
        self.eps = check_eps(eps)
        self.weight_init: WeightInit = weight_init

    def setup(self, federation: Federation) -> None:
        module = federation.module
        require_mixin(module, ProbabilityMaskMixin, self)
        seed = derive_seed(federation.seed, "fedpm")
        module.reset_random_network(seed, weight_init=self.weight_init)  # type: ignore[attr-defined]
        super().setup(federation)

    def uploaded_tensors(self, module: pl.LightningModule) -> State:
        """Every state tensor but the frozen weights: :math:`\\theta` (as masks) and the unmasked tensors."""
        frozen = set(module.masked_parameter_names)  # type: ignore[attr-defined]
        return {name: t for name, t in self.federation.local_weights().items() if name not in frozen}

    def compressible_names(self, module: pl.LightningModule) -> list[str]:
        """The ``state_dict`` names of the mask probabilities :math:`\\theta`."""
        return list(module.mask_probability_names.values())  # type: ignore[attr-defined]

    @property
    def uploads_deltas(self) -> bool:
        """No: the masked tensors' decoded uploads are masks, not deltas, so no update bound applies."""
        return False

    def download_bytes(self, global_state: State) -> int:
        """4 bytes per element of :math:`\\theta` and of every unmasked tensor."""
        return self.dense_bytes()

    def configure_client(self, client: ClientContext, module: pl.LightningModule, global_state: State) -> None:
        generator = device_generator(derive_seed(client.seed, "fedpm", "train"), module.device)
        module.begin_probability_mask_round(eps=self.eps, generator=generator)  # type: ignore[attr-defined]

    def encode(self, client: ClientContext, module: pl.LightningModule, delta: State) -> bytes:
        final = device_generator(derive_seed(client.seed, "fedpm", "mask"), module.device)
        bits = module.end_probability_mask_round(final)  # type: ignore[attr-defined]
        names = module.mask_probability_names  # type: ignore[attr-defined]
        return self.codec.encode({names[name]: b for name, b in bits.items()}, delta, self.layout)

    def aggregate_decoded(self, round_idx: int, global_state: State, updates: list[ClientUpdate]) -> dict[str, float]:
        """Sets :math:`\theta` to the weighted mask average and FedAvg-averages the unmasked tensors."""
        weights = [u.num_samples if self.weighting == "samples" else 1.0 for u in updates]
        masked = [s.name for s in self.layout.compressed]
        # θ^{t+1} = Σ_k p_k m_k^t / Σ_k p_k (Li et al. 2024 §2.2, FedPM's aggregation).
        theta = weighted_average([{n: u.payload[n] for n in masked} for u in updates], weights)
        with torch.no_grad():
            for name in masked:
                global_state[name].copy_(theta[name])
        dense = [s.name for s in self.layout.dense]
        if dense:
            dense_updates = [replace(u, payload={n: u.payload[n] for n in dense}) for u in updates]
            super().aggregate_decoded(round_idx, {n: global_state[n] for n in dense}, dense_updates)
        total = sum(float(theta[n].sum()) for n in masked)
        return {"mask_density": total / sum(s.numel for s in self.layout.compressed)}
