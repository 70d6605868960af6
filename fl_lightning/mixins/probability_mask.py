r"""FedPM's client side as a LightningModule mixin: a sparse random network with trainable
Bernoulli masks (Isik et al., ICLR 2023).

How it hooks in (any LightningModule, its own ``training_step`` and ``configure_optimizers``):

- At ``setup`` every module owning a maskable parameter gets a child :class:`ProbabilityMask`
  holding the mask probabilities :math:`\theta` (persistent buffers: they *are* the global model,
  so they enter ``state_dict``, the loop's global state and checkpoints, under
  ``<owner>.probability_mask.<name>``), the scores :math:`s` (parameters of an
  :class:`MaskScores` child that ``state_dict`` never sees, so ``self.parameters()`` hands them
  to the module's own optimizer) and fixed uniform draws :math:`U` for evaluation. The masked
  weights are frozen for good (``requires_grad=False``).
- A forward pre-hook on the owner swaps the weight for :math:`w \odot m` for the duration of its
  ``forward`` (see :mod:`fl_lightning.mixins._holders`). In a client round, in training mode,
  :math:`m \sim \mathrm{Bern}(\mathrm{sigmoid}(s))` is drawn afresh in every forward with a
  straight-through gradient to :math:`s`; otherwise (server evaluation, outside a round)
  :math:`m = \mathbb{1}[U < \theta]`: a sample of :math:`\mathrm{Bern}(\theta)` that is a fixed
  function of :math:`\theta`, so evaluation is deterministic.

The mixin is never inert: the module is always the masked random network. Use it with
:class:`~fl_lightning.algorithms.FedPM`; other algorithms would train only the unmasked tensors.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor, nn

from fl_lightning.compression.probability_mask_codec import (
    DEFAULT_EPS,
    bernoulli_mask,
    sample_probability_mask,
    scores_from_probabilities,
    signed_constant_,
)
from fl_lightning.mixins._holders import (
    Unsaved,
    WeightSwap,
    check_optimized,
    default_maskable_names,
    install_holders,
)
from fl_lightning.utils.seeding import make_generator

WeightInit = Literal["signed_constant", "module"]
WEIGHT_INITS: tuple[WeightInit, ...] = ("signed_constant", "module")


class MaskScores(Unsaved):
    """The scores :math:`s` of one module's masked weights, by parameter name; never in ``state_dict``."""

    def __init__(self, owner: nn.Module, names: list[str]) -> None:
        super().__init__()
        for name in names:
            weight = owner.get_parameter(name)
            score = torch.zeros(weight.shape, device=weight.device)
            self.register_parameter(name, nn.Parameter(score))


class ProbabilityMask(WeightSwap):
    r"""Mask probabilities :math:`\theta` (buffers named as the masked parameters), evaluation draws
    :math:`U` (``<name>_uniform``, not persistent) and :class:`MaskScores` of one module."""

    def __init__(self, owner: nn.Module, names: list[str]) -> None:
        super().__init__()
        uniform = torch.Generator().manual_seed(0)  # reset_random_network re-draws it from the run seed
        for name in names:
            weight = owner.get_parameter(name)
            theta = torch.full(weight.shape, 0.5, device=weight.device)
            draws = torch.rand(weight.shape, generator=uniform).to(weight.device)
            self.register_buffer(name, theta)
            self.register_buffer(f"{name}_uniform", draws, persistent=False)
        self.scores = MaskScores(owner, names)
        self.names = names
        #: Whether forward passes in training mode sample masks from the scores (a client round).
        self.sampling = False
        self.generator: torch.Generator | None = None

    def effective_weights(self, owner: nn.Module) -> dict[str, Tensor]:
        out = {}
        for name in self.names:
            weight = owner.get_parameter(name).detach()
            if self.sampling and owner.training:
                mask = sample_probability_mask(self.scores.get_parameter(name), self.generator)
            else:
                mask = self.get_buffer(f"{name}_uniform") < self.get_buffer(name)
            out[name] = weight * mask.to(weight.dtype)
        return out


class ProbabilityMaskMixin:
    r"""Trains Bernoulli masks over frozen random weights (FedPM, Isik et al. 2023).

    Put it first among the bases (``class MyModel(ProbabilityMaskMixin, MyLightningModule)``);
    :class:`~fl_lightning.algorithms.FedPM` drives it. In a round the forward weight of each
    masked tensor is :math:`w \odot m` with :math:`m \sim \mathrm{Bern}(\mathrm{sigmoid}(s))`
    drawn in every forward pass and straight-through gradients to :math:`s` (Li et al. 2024 §2.2
    quoting FedPM; Zhou et al. 2019). Scores start each round at
    :math:`\mathrm{sigmoid}^{-1}(\mathrm{clip}(\theta, \epsilon, 1 - \epsilon))`; :math:`\theta`
    itself changes only through the server.

    Maskable tensors: :meth:`maskable_parameter_names` (default: Conv/Linear weights); biases and
    BatchNorm train normally. The module's ``configure_optimizers`` must optimise
    ``self.parameters()`` (or at least the :class:`MaskScores`); checked when a round begins.
    """

    _mask_owners: dict[str, tuple[nn.Module, str, ProbabilityMask]] | None = None

    def maskable_parameter_names(self) -> list[str]:
        """Full names of the parameters to mask (default :func:`default_maskable_names`)."""
        return default_maskable_names(self)  # type: ignore[arg-type]

    def setup(self, stage: str) -> None:
        super().setup(stage)  # type: ignore[misc]
        self.install_probability_masks()

    def install_probability_masks(self) -> None:
        """Adds the :class:`ProbabilityMask` holders and hooks and freezes the masked weights
        (idempotent; ``setup`` calls it before ``configure_optimizers``, so the scores reach the
        optimizer, and before a checkpoint is restored, so :math:`\\theta` is loaded)."""
        if self._mask_owners is not None:
            return
        names = self.maskable_parameter_names()
        self._mask_owners = install_holders(self, names, "probability_mask", ProbabilityMask)  # type: ignore[arg-type]
        for owner, local, _ in self._mask_owners.values():
            owner.get_parameter(local).requires_grad_(False)

    @property
    def masked_parameter_names(self) -> list[str]:
        """The masked (frozen) parameters, in order (empty before :meth:`install_probability_masks`)."""
        return list(self._mask_owners or {})

    @property
    def mask_probability_names(self) -> dict[str, str]:
        r"""The ``state_dict`` name of each masked parameter's :math:`\theta`, by parameter name."""
        out = {}
        for name, (_, local, _) in self._owners().items():
            prefix = name.rpartition(".")[0]
            out[name] = f"{prefix}.probability_mask.{local}" if prefix else f"probability_mask.{local}"
        return out

    def mask_probabilities(self) -> dict[str, Tensor]:
        r""":math:`\theta` by masked parameter name (live buffers)."""
        return {name: holder.get_buffer(local) for name, (_, local, holder) in self._owners().items()}

    def mask_scores(self) -> dict[str, Tensor]:
        """The scores :math:`s` by masked parameter name (live parameters)."""
        return {name: holder.scores.get_parameter(local) for name, (_, local, holder) in self._owners().items()}

    def reset_random_network(self, seed: int, *, weight_init: WeightInit = "signed_constant") -> None:
        r"""Re-draws the evaluation draws :math:`U` and, with ``weight_init="signed_constant"``, the
        frozen weights (:func:`~fl_lightning.compression.probability_mask_codec.signed_constant_`), from
        ``seed`` on the CPU, so any party holding the seed rebuilds them bit for bit. ``"module"``
        keeps the module's own initialisation. :math:`\theta` is left as it is."""
        if weight_init not in WEIGHT_INITS:
            raise ValueError(f"`weight_init` must be one of {WEIGHT_INITS}, got {weight_init!r}.")
        self.install_probability_masks()
        weights = make_generator(seed, "weights")
        uniform = make_generator(seed, "evaluation")
        with torch.no_grad():
            for owner, local, holder in self._owners().values():
                if weight_init == "signed_constant":
                    signed_constant_(owner.get_parameter(local), weights)
                draws = holder.get_buffer(f"{local}_uniform")
                draws.copy_(torch.rand(draws.shape, generator=uniform))

    def begin_probability_mask_round(self, *, eps: float = DEFAULT_EPS, generator: torch.Generator | None = None) -> None:
        r"""Starts a client round: :math:`s \leftarrow \mathrm{sigmoid}^{-1}(\mathrm{clip}(\theta, \epsilon, 1 - \epsilon))`
        and mask sampling in training-mode forwards, drawing from ``generator`` (on the module's device)."""
        self.install_probability_masks()
        check_optimized(self, self.mask_scores(), "mask scores")  # type: ignore[arg-type]
        with torch.no_grad():
            for _, local, holder in self._owners().values():
                holder.scores.get_parameter(local).copy_(scores_from_probabilities(holder.get_buffer(local), eps))
        for _, _, holder in self._owners().values():
            holder.sampling, holder.generator = True, generator

    def end_probability_mask_round(self, generator: torch.Generator | None = None) -> dict[str, Tensor]:
        r"""Ends the round and returns the masks to upload, :math:`m \sim \mathrm{Bern}(\mathrm{sigmoid}(s))`
        (one more draw from ``generator``), as booleans by masked parameter name."""
        owners = self._owners()
        if not any(holder.sampling for _, _, holder in owners.values()):
            raise RuntimeError("end_probability_mask_round() called without begin_probability_mask_round().")
        with torch.no_grad():
            bits = {
                name: bernoulli_mask(torch.sigmoid(h.scores.get_parameter(local)), generator)
                for name, (_, local, h) in owners.items()
            }
        for _, _, holder in owners.values():
            holder.sampling, holder.generator = False, None
        return bits

    def _owners(self) -> dict[str, tuple[nn.Module, str, ProbabilityMask]]:
        return self._mask_owners or {}
