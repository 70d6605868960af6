r"""FedMRN's client side as a LightningModule mixin: train a latent update through masked noise.

How it hooks in (any LightningModule, its own ``training_step`` and ``configure_optimizers``):

- At ``setup`` every maskable module (the owner of a maskable parameter) gets a child
  :class:`LatentUpdate` holding the latent update :math:`u` (an ``nn.Parameter``, so
  ``self.parameters()`` hands it to the module's own optimizer) and the noise :math:`n` (a
  buffer, so it follows ``.to(device)``). ``LatentUpdate`` writes nothing to ``state_dict`` and
  reads nothing from it: :math:`u` and :math:`n` never enter the global state, checkpoints or
  aggregation, and state dicts keep the plain model's keys.
- A forward pre-hook on the owner swaps the parameter for the effective weight
  :math:`w^t + \hat u` for the duration of its ``forward`` (as ``torch.func.functional_call``
  does; a forward hook with ``always_call=True`` swaps it back), so every call path reaches it.
- The mixin's ``training_step`` draws :math:`\hat u` (eq. 10) once per batch before calling the
  module's own ``training_step``. During a round the masked global weights are frozen
  (``requires_grad=False``, never in the graph); other parameters (biases, BatchNorm) train normally.
- Under the batched executor (``torch.vmap`` over clients, which cannot call a client's own generator) the
  draws are made before each step, per client from its own generator in the sequential order, and the stacked
  :math:`\hat u` values are computed over all clients at once (:meth:`MaskedNoiseMixin.step_tensors`); within the
  vmapped step the mixin reads its client's row (:meth:`MaskedNoiseMixin.term_bound_to`).

Outside a round (:meth:`begin_masked_noise_round` … :meth:`end_masked_noise_round`) the
mixin is inert: the module is the plain model, e.g. for FedAvg or server evaluation.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from fl_lightning.compression.masked_noise_codec import (
    MaskType,
    check_mask_type,
    deterministic_mask,
    psm_draws,
    psm_value,
    sample_mask,
    straight_through,
)
from fl_lightning.mixins._holders import (
    Unsaved,
    WeightSwap,
    check_optimized,
    default_maskable_names,
    install_alias_swaps,
    install_holders,
)
from fl_lightning.mixins.applied_term import AppliedTermMixin, ClientTerm, attribute_set, term_step

#: The child attribute of a masked parameter's owner that holds its :class:`LatentUpdate`.
HOLDER = "latent_update"


class LatentUpdate(WeightSwap, Unsaved):
    """The latent updates :math:`u` (parameters) and noise :math:`n` (buffers) of one module's masked
    tensors, by the masked parameter's name. Invisible to ``state_dict`` / ``load_state_dict``."""

    def __init__(self, owner: nn.Module, names: list[str]) -> None:
        super().__init__()
        for name in names:
            weight = owner.get_parameter(name)
            self.register_parameter(name, nn.Parameter(torch.zeros_like(weight)))
            self.register_buffer(f"{name}_noise", torch.zeros(weight.shape, device=weight.device), persistent=False)
        self.names = names
        #: Effective weights of the current step, swapped in by the owner's forward pre-hook.
        self.effective: dict[str, Tensor] = {}

    def noise(self, name: str) -> Tensor:
        return self.get_buffer(f"{name}_noise")

    def effective_weights(self, owner: nn.Module) -> dict[str, Tensor]:
        return self.effective


@dataclass
class _Round:
    total_steps: int
    mask: MaskType
    stochastic: bool
    progressive: bool
    generator: torch.Generator | None
    batches: int = 0
    requires_grad: dict[str, bool] = field(default_factory=dict)

    def probability(self, accumulate: int) -> float:
        r"""PM's :math:`p = \tau/S` after :attr:`batches` batches (1 without progressive masking)."""
        if not self.progressive:
            return 1.0
        return min(math.ceil(self.batches / accumulate) / self.total_steps, 1.0)


class MaskedNoiseMixin(AppliedTermMixin):
    r"""Trains :math:`\hat u` in :math:`w^t + \hat u` with progressive stochastic masking (FedMRN, Li et al. 2024).

    Put it first among the bases (``class MyModel(MaskedNoiseMixin, MyLightningModule)``);
    :class:`~fl_lightning.algorithms.FedMRN` drives it. In a round, each masked tensor's forward
    weight at local step :math:`\tau` of :math:`S` is :math:`w^t + \hat u` with (eq. 10)

    .. math:: \hat u = (1 - P) \odot \mathrm{clip}(u, n) + P \odot n \odot \mathcal{M}(u, n),
              \qquad P \sim \mathrm{Bern}(\tau / S),

    :math:`\mathcal{M}` stochastic masking (eq. 6 binary, eq. 7 signed) and straight-through
    gradients to :math:`u` (eq. 9). :math:`\tau` counts optimizer steps (batches divided by
    ``accumulate_grad_batches``), so the last step masks every element. Ablations:
    ``progressive=False`` uses :math:`P \equiv 1` (SM only); ``stochastic=False`` uses
    deterministic masking :math:`\mathbb{1}[u n > 0]`.

    Maskable tensors: :meth:`maskable_parameter_names` (default: Conv/Linear weights); override it
    to choose others. The module's ``configure_optimizers`` must optimise ``self.parameters()``
    (or at least the :class:`LatentUpdate` parameters); this is checked when a round begins.
    """

    _masked_owners: dict[str, tuple[nn.Module, str, LatentUpdate]] | None = None
    _masked_round: _Round | None = None
    #: One client's :math:`\hat u` values by masked name, given by the batched executor (``None``: drawn here).
    _bound_values: Mapping[str, Tensor] | None = None

    def maskable_parameter_names(self) -> list[str]:
        """Full names of the parameters to mask (default :func:`default_maskable_names`)."""
        return default_maskable_names(self)  # type: ignore[arg-type]

    def setup(self, stage: str) -> None:
        super().setup(stage)  # type: ignore[misc]
        self.install_masked_noise()

    def install_masked_noise(self) -> None:
        """Adds the :class:`LatentUpdate` holders and hooks (idempotent; ``setup`` calls it before
        ``configure_optimizers``, so the latent updates reach the optimizer)."""
        if self._masked_owners is not None:
            return
        names = self.maskable_parameter_names()
        self._masked_owners = install_holders(self, names, HOLDER, LatentUpdate)  # type: ignore[arg-type]
        install_alias_swaps(self, self._masked_owners, "latent_update_alias")  # type: ignore[arg-type]

    @property
    def masked_parameter_names(self) -> list[str]:
        """The masked parameters, in order (empty before :meth:`install_masked_noise`)."""
        return list(self._masked_owners or {})

    def begin_masked_noise_round(
        self,
        noise: Mapping[str, Tensor],
        *,
        total_steps: int,
        mask: MaskType = "binary",
        stochastic: bool = True,
        progressive: bool = True,
        generator: torch.Generator | None = None,
    ) -> None:
        """Starts a client round: :math:`u \\leftarrow 0`, the round's noise, step counter :math:`\\tau = 0`.

        Args:
            noise: :math:`n = G(s)` by masked parameter name (see ``MaskedNoiseCodec.noise``).
            total_steps: :math:`S`, the client's optimizer steps this round (>= 1).
            mask: ``"binary"`` or ``"signed"``.
            stochastic: stochastic (eq. 6/7) or deterministic masking.
            progressive: progressive masking :math:`P \\sim \\mathrm{Bern}(\\tau/S)` or :math:`P \\equiv 1`.
            generator: source of the per-step mask and :math:`P` draws, on the module's device.
        """
        self.install_masked_noise()
        assert self._masked_owners is not None
        if isinstance(total_steps, bool) or not isinstance(total_steps, int) or total_steps < 1:
            raise ValueError(f"`total_steps` must be a positive integer, got {total_steps!r}.")
        if set(noise) != set(self._masked_owners):
            raise ValueError(f"Noise is given for {sorted(noise)}, the masked parameters are {sorted(self._masked_owners)}.")
        state = _Round(total_steps, check_mask_type(mask), stochastic, progressive, generator)
        self._check_optimized()
        self._close_round()  # a previous round that never ended (e.g. training raised)
        with torch.no_grad():
            for name, (owner, local, holder) in self._masked_owners.items():
                weight = owner.get_parameter(local)
                if noise[name].shape != weight.shape:
                    raise ValueError(
                        f"Noise for {name!r} has shape {tuple(noise[name].shape)}, the weight {tuple(weight.shape)}."
                    )
                holder.get_parameter(local).zero_()
                holder.noise(local).copy_(noise[name])
                state.requires_grad[name] = weight.requires_grad
                weight.requires_grad_(False)
                holder.effective.clear()
        self._masked_round = state
        self._set_term(MaskedNoiseMixin, True)

    def end_masked_noise_round(self, generator: torch.Generator | None = None) -> dict[str, Tensor]:
        """Ends the round and returns the final masks :math:`m = \\mathcal{M}(u, n)` (one more
        stochastic draw from ``generator``; deterministic masking when the round is) as booleans."""
        state = self._masked_round
        if state is None or self._masked_owners is None:
            raise RuntimeError("end_masked_noise_round() called without begin_masked_noise_round().")
        bits = {}
        with torch.no_grad():
            for name, (_, local, holder) in self._masked_owners.items():
                u, n = holder.get_parameter(local), holder.noise(local)
                bits[name] = sample_mask(u, n, state.mask, generator) if state.stochastic else deterministic_mask(u, n)
        self._close_round()
        return bits

    def _close_round(self) -> None:
        """Makes the module plain again: no effective weights, masked weights' ``requires_grad`` restored."""
        state = self._masked_round
        if state is None or self._masked_owners is None:
            return
        for name, (owner, local, holder) in self._masked_owners.items():
            holder.effective.clear()
            owner.get_parameter(local).requires_grad_(state.requires_grad[name])
        self._masked_round = None
        self._set_term(MaskedNoiseMixin, False)

    def latent_updates(self) -> dict[str, Tensor]:
        """The latent updates :math:`u` by masked parameter name (live tensors)."""
        return {name: holder.get_parameter(local) for name, (_, local, holder) in (self._masked_owners or {}).items()}

    @property
    def masking_probability(self) -> float:
        r"""PM's :math:`p = \tau/S` at the current step (1 without progressive masking; 0 outside a round)."""
        state = self._masked_round
        return 0.0 if state is None else state.probability(self._accumulate())

    def _accumulate(self) -> int:
        trainer = getattr(self, "_trainer", None)
        return trainer.accumulate_grad_batches if trainer is not None else 1

    def draw_masked_noise(self) -> None:
        """Advances the batch counter and draws this step's effective weights (eq. 10)."""
        state = self._masked_round
        assert state is not None and self._masked_owners is not None
        state.batches += 1
        p = self.masking_probability
        values = {}
        for name, (_, local, holder) in self._masked_owners.items():
            u = holder.get_parameter(local)
            draw, chosen = psm_draws(u, p=p, stochastic=state.stochastic, generator=state.generator)
            values[name] = psm_value(u, holder.noise(local), draw, chosen, state.mask)
        self._set_effective(values)

    def _set_effective(self, values: Mapping[str, Tensor]) -> None:
        r"""Each masked weight's effective tensor :math:`w^t + \hat u`, the gradient passing to ``u`` (eq. 9)."""
        assert self._masked_owners is not None
        for name, (owner, local, holder) in self._masked_owners.items():
            # getattr, not get_parameter: under functional_call (the batched executor) they hold plain tensors.
            update = straight_through(getattr(holder, local), values[name])
            holder.effective[local] = getattr(owner, local).detach() + update

    @term_step
    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        if self._masked_round is not None:
            if self._bound_values is None:
                self.draw_masked_noise()
            else:
                self._set_effective(self._bound_values)
            self._count_term_step(MaskedNoiseMixin)
        return super().training_step(*args, **kwargs)  # type: ignore[misc]

    def client_term(self) -> ClientTerm | None:
        """The round as the batched executor steps it: no fixed tensors; the settings; the round (generator, counter)."""
        state = self._masked_round
        assert state is not None
        return ClientTerm({}, (float(state.mask == "signed"), float(state.stochastic), float(state.progressive)), state)

    def step_tensors(self, terms: Sequence[ClientTerm], weights: Mapping[str, Tensor]) -> dict[str, Tensor]:
        r"""This step's :math:`\hat u` (eq. 10) of the clients still training, stacked, by masked name: each client's
        counter advanced and its draws made from its own generator in the sequential order (tensor by tensor, the
        masking's uniforms then :math:`P`'s), then :func:`psm_value` over the stacked :math:`u` and :math:`n`
        (the first rows of ``weights``, the holders' tensors by full name), elementwise as for one client."""
        assert self._masked_owners is not None
        rounds: list[_Round] = [term.state for term in terms]
        first = rounds[0]
        for state in rounds:
            state.batches += 1
        accumulate = self._accumulate()
        probabilities = [state.probability(accumulate) for state in rounds]
        values = {}
        for name, (_, local, _) in self._masked_owners.items():
            holder = f"{name.rpartition('.')[0]}.{HOLDER}".lstrip(".")
            u, n = weights[f"{holder}.{local}"][: len(rounds)], weights[f"{holder}.{local}_noise"][: len(rounds)]
            draws = [
                psm_draws(u[j], p=p, stochastic=first.stochastic, generator=state.generator)
                for j, (state, p) in enumerate(zip(rounds, probabilities))
            ]
            draw = torch.stack([d for d, _ in draws]) if first.stochastic else None
            chosen = None
            if any(c is not None for _, c in draws):  # P = 1 for a client at p = 1: all of its elements masked
                chosen = torch.stack([torch.ones_like(u[0], dtype=torch.bool) if c is None else c for _, c in draws])
            values[name] = psm_value(u, n, draw, chosen, first.mask)
        return values

    def term_bound_to(self, params: Mapping[str, Tensor], tensors: Mapping[str, Tensor]) -> AbstractContextManager[None]:
        return attribute_set(self, "_bound_values", tensors)

    def resume_client_term(self, term: ClientTerm) -> None:
        """The client's round again, its batched steps counted, so that :meth:`end_masked_noise_round` ends it."""
        self._masked_round = term.state
        self._set_term(MaskedNoiseMixin, True, term.state.batches)

    def _check_optimized(self) -> None:
        check_optimized(self, self.latent_updates(), "latent updates")  # type: ignore[arg-type]
