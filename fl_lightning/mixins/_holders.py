"""Shared machinery of the masking mixins: per-module holders whose tensors replace a parameter
during its owner's ``forward``, and tensors kept out of ``state_dict``.

A *holder* is a child module added to each module that owns a masked parameter. A forward
pre-hook on the owner swaps the parameter for the holder's effective tensor for the duration of
the owner's ``forward`` (as ``torch.func.functional_call`` does), and a forward hook registered
with ``always_call=True`` swaps it back even if the forward raises, so every call path
(``self(x)``, ``self.net(x)``, a sub-module called directly) sees the effective weight while
``state_dict`` keeps the plain model's keys.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import lightning.pytorch as pl
from torch import Tensor, nn

_MASKABLE_MODULES = (nn.Linear, nn.modules.conv._ConvNd, nn.Embedding)

Holder = TypeVar("Holder", bound="WeightSwap")


def default_maskable_names(module: nn.Module) -> list[str]:
    """The trainable weight matrices: ``weight`` of every ``nn.Linear``, convolution (1-3d, transposed) and
    ``nn.Embedding``, and every ``weight_*`` of a recurrent layer (``nn.RNN``, ``nn.GRU``, ``nn.LSTM``),
    in ``state_dict`` order. A weight that does not require grad (a frozen base: never sent) is left out, and a
    tied weight is named once, under its first name (its other owners see the same effective weight).

    A recurrent layer reads its weights from ``_parameters`` on every forward (torch >= 2.15, as pinned), so
    the holders' swap reaches them; ``tests/mixins/test_recurrent_masking.py`` guards that.
    """
    names, seen = [], set()
    for prefix, m in module.named_modules():
        if isinstance(m, _MASKABLE_MODULES):
            local = ["weight"] if isinstance(m.weight, nn.Parameter) else []
        elif isinstance(m, nn.RNNBase):
            local = [name for name in m._flat_weights_names if name.startswith("weight_")]
        else:
            continue
        for name in local:
            weight = m.get_parameter(name)
            if weight.requires_grad and id(weight) not in seen:
                seen.add(id(weight))
                names.append(f"{prefix}.{name}" if prefix else name)
    return names


class Unsaved(nn.Module):
    """A module whose tensors never enter ``state_dict`` and are never read from it (per-round
    client state): a strict ``load_state_dict`` of the plain model's weights still works."""

    def _save_to_state_dict(self, destination: Any, prefix: str, keep_vars: bool) -> None:
        """Saves nothing."""

    def _load_from_state_dict(self, state_dict: Any, prefix: str, *args: Any) -> None:
        """Loads nothing."""


def holder_tensors(module: nn.Module) -> dict[str, Tensor]:
    """The tensors of ``module``'s :class:`Unsaved` holders (FedMRN's latent updates and noise) by full name: a client's
    state for its round, outside ``state_dict`` (the batched executor stacks them per client)."""
    return {
        f"{prefix}.{name}" if prefix else name: t
        for prefix, m in module.named_modules() if isinstance(m, Unsaved)
        for name, t in (*m.named_parameters(recurse=False), *m.named_buffers(recurse=False))
    }


class WeightSwap(nn.Module, ABC):
    """A holder: swaps its owner's parameters for :meth:`effective_weights` during the owner's forward."""

    def __init__(self) -> None:
        super().__init__()
        self._stash: dict[str, Tensor] = {}

    @abstractmethod
    def effective_weights(self, owner: nn.Module) -> Mapping[str, Tensor]:
        """The tensors to swap in for this forward call, by the owner's local parameter name
        (``owner``'s own parameters are still in place when it is called)."""

    def swap_in(self, owner: nn.Module, args: Any) -> None:
        for name, effective in self.effective_weights(owner).items():
            self._stash[name] = owner._parameters[name]  # type: ignore[assignment]
            owner._parameters[name] = effective  # type: ignore[assignment]

    def swap_out(self, owner: nn.Module, args: Any, output: Any) -> None:
        for name, weight in self._stash.items():
            owner._parameters[name] = weight  # type: ignore[assignment]
        self._stash.clear()


def install_holders(
    module: nn.Module,
    names: list[str],
    attribute: str,
    make: Callable[[nn.Module, list[str]], Holder],
) -> dict[str, tuple[nn.Module, str, Holder]]:
    """Adds ``make(owner, local_names)`` as child ``attribute`` of every module owning one of
    ``names`` and hooks it into the owner's forward.

    Returns:
        ``(owner, local name, holder)`` by full parameter name, in the order of ``names``.

    Raises:
        ValueError: ``names`` is empty or names something that is not a parameter of ``module``,
            or an owner already has an attribute ``attribute``.
    """
    known = dict(module.named_parameters())
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise ValueError(f"maskable_parameter_names() must name parameters of the module; got {names} (unknown: {unknown}).")
    by_owner: dict[str, list[str]] = {}
    for full in names:
        prefix, _, local = full.rpartition(".")
        by_owner.setdefault(prefix, []).append(local)
    owners = {}
    for prefix, locals_ in by_owner.items():
        owner = module.get_submodule(prefix)
        if hasattr(owner, attribute):
            raise ValueError(f"Module {prefix!r} already has an attribute `{attribute}`; cannot add the {attribute} holder.")
        holder = make(owner, locals_)
        owner.add_module(attribute, holder)
        owner.register_forward_pre_hook(holder.swap_in)
        owner.register_forward_hook(holder.swap_out, always_call=True)
        for local in locals_:
            owners[f"{prefix}.{local}" if prefix else local] = (owner, local, holder)
    return {n: owners[n] for n in names}


class AliasSwap(WeightSwap, Unsaved):
    """Swaps a tied weight's effective tensor into another module that holds the same parameter (GPT-2's
    ``lm_head.weight`` is ``transformer.wte.weight``), so every owner computes with one effective weight."""

    def __init__(self, sources: dict[str, tuple[nn.Module, str, WeightSwap]]) -> None:
        super().__init__()
        # A plain dict: the source holders are children of their own owners, not of this module.
        self.sources = sources

    def effective_weights(self, owner: nn.Module) -> dict[str, Tensor]:
        out = {}
        for alias, (source_owner, local, holder) in self.sources.items():
            effective = holder.effective_weights(source_owner).get(local)
            if effective is not None:
                out[alias] = effective
        return out


def install_alias_swaps(module: nn.Module, owners: Mapping[str, tuple[nn.Module, str, WeightSwap]], attribute: str) -> None:
    """Adds an :class:`AliasSwap` as child ``attribute`` of every module that holds one of the parameters of
    ``owners`` (from :func:`install_holders`) under another name. For holders whose effective weights are drawn
    once per step (``effective_weights`` returns the same tensors on every call of the step)."""
    by_id = {id(owner.get_parameter(local)): entry for entry in owners.values() for owner, local, _ in [entry]}
    aliases: dict[str, dict[str, tuple[nn.Module, str, WeightSwap]]] = {}
    for full, parameter in module.named_parameters(remove_duplicate=False):
        entry = by_id.get(id(parameter))
        prefix, _, local = full.rpartition(".")
        if entry is not None and (module.get_submodule(prefix), local) != entry[:2]:
            aliases.setdefault(prefix, {})[local] = entry
    for prefix, sources in aliases.items():
        owner = module.get_submodule(prefix)
        holder = AliasSwap(sources)
        owner.add_module(attribute, holder)
        owner.register_forward_pre_hook(holder.swap_in)
        owner.register_forward_hook(holder.swap_out, always_call=True)


def check_optimized(module: pl.LightningModule, tensors: Mapping[str, Tensor], what: str) -> None:
    """Raises ``ValueError`` naming the ``tensors`` (e.g. latent updates, scores) that no optimizer of
    the module's trainer optimises; does nothing before the optimizers exist."""
    trainer = getattr(module, "_trainer", None)
    optimizers = getattr(trainer, "optimizers", None) or []
    if not optimizers:
        return
    optimized = {id(p) for opt in optimizers for group in opt.param_groups for p in group["params"]}
    missing = [n for n, t in tensors.items() if id(t) not in optimized]
    if missing:
        raise ValueError(
            f"The {what} of {missing} are not in any optimizer: configure_optimizers must optimise "
            "self.parameters(), which includes them."
        )
