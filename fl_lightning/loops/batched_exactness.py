"""What would make the batched executor's weights differ from the sequential executors' by more than float rounding,
refused before the first step (:func:`check_parameter_references`) or named once, as the first step runs
(:func:`warn_randomness`).

*Parameter references.* The batched executor runs ``training_step`` through ``torch.func.functional_call``, which
swaps the tensors registered in the module's ``_parameters`` and ``_buffers`` for each client's slice of the stacked
weights. A tensor the module keeps anywhere else (``self.anchor = [p.detach() for p in self.parameters()]``,
``self.params = list(self.parameters())``) still points at the real weights, so a loss term built over it reads the
global weights, gets no gradient, and the run trains another loss with no error. The library's own term mixins keep
such references too (:class:`~fl_lightning.mixins.applied_term.AppliedTermMixin`) and rebind them per client
(:mod:`~fl_lightning.loops.batched_terms`); everything else is refused.

*Randomness.* Under ``vmap(randomness="different")`` each client draws its own random numbers (dropout masks, noise),
as if trained alone, but not the numbers the sequential executors draw from the same seed: the weights agree in
distribution, not to float rounding (an audit measured 0.14 with dropout). This is warned, naming the modules and the
random operations, rather than refused: each client's training is still a correct draw of the same procedure (the same
rates, independent masks), as a change of seed is, and refusing would keep every model with dropout (most
transformers, the LoRA recipes) off the executor that exists for speed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from fl_lightning.mixins.applied_term import AppliedTermMixin

__all__ = [
    "RandomCalls", "check_parameter_references", "dropout_modules", "hidden_parameter_references",
    "warn_randomness",
]

PREFIX = "client_executor='batched'"

#: ``nn.Module`` slots that ``functional_call`` swaps (or that hold submodules, scanned one by one).
_SWAPPED_SLOTS = frozenset({"_parameters", "_buffers", "_modules"})

#: Random functions and methods that draw whatever their arguments (``torch.*``, ``Tensor.*``, ``F.*``).
_ALWAYS_RANDOM = frozenset({
    "bernoulli", "bernoulli_", "rand", "rand_like", "randn", "randn_like", "randint", "randint_like", "randperm",
    "normal", "normal_", "uniform_", "exponential_", "geometric_", "cauchy_", "log_normal_", "random_", "multinomial",
    "poisson", "gumbel_softmax", "native_dropout",
})
#: Random functions that draw only in training and with a rate above 0 (a dropout probability, RReLU's lower slope):
#: ``name -> (rate, training)``, each as ``(position, keyword, default)`` in ``torch.nn.functional``'s signature
#: (``training=None``: the function has no such argument).
_RANDOM_IF = {
    **{name: ((1, "p", 0.5), (2, "training", True)) for name in (
        "dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout")},
    "rrelu": ((1, "lower", 1.0 / 8), (3, "training", False)),
    "scaled_dot_product_attention": ((4, "dropout_p", 0.0), None),
    "multi_head_attention_forward": ((10, "dropout_p", 0.0), (13, "training", True)),
}


def _tensors(value: Any, path: str, seen: set[int]) -> Iterator[tuple[str, Tensor]]:
    """The tensors in ``value`` (a tensor, or lists, tuples, sets and dicts of them, nested), with their paths."""
    if id(value) in seen:
        return
    seen.add(id(value))
    if isinstance(value, Tensor):
        yield path, value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _tensors(item, f"{path}[{key!r}]", seen)
    elif isinstance(value, (list, tuple, set, frozenset)):
        for i, item in enumerate(value):
            yield from _tensors(item, f"{path}[{i}]", seen)


def _storage(t: Tensor) -> tuple[torch.device, int] | None:
    """Where ``t``'s memory starts (views of one tensor share it); ``None`` for a tensor without memory (meta, sparse)."""
    if t.device.type == "meta" or t.layout != torch.strided:
        return None
    return t.device, t.untyped_storage().data_ptr()


def _term_attributes(module: nn.Module) -> set[str]:
    """The attributes the library's term mixins rebind per client under the batched executor."""
    return {
        name for cls in type(module).__mro__ if issubclass(cls, AppliedTermMixin) and cls.__module__.startswith("fl_lightning.")
        for name in vars(cls)
    }


def hidden_parameter_references(module: nn.Module) -> list[tuple[str, str]]:
    """``(attribute path, tensor name)`` for every tensor the module or a submodule keeps outside its registered
    parameters and buffers that is, or shares memory with, one of them: what ``functional_call`` cannot swap."""
    registered = {**dict(module.named_buffers(remove_duplicate=False)), **dict(module.named_parameters(remove_duplicate=False))}
    by_storage: dict[tuple[torch.device, int] | None, str] = {}
    for name, t in registered.items():
        by_storage.setdefault(_storage(t), name)
    found, seen = [], set()
    for prefix, sub in module.named_modules():
        skipped = _SWAPPED_SLOTS | (_term_attributes(sub) if isinstance(sub, AppliedTermMixin) else set())
        owner = f"{type(module).__name__}.{prefix + '.' if prefix else ''}"
        for attribute, value in vars(sub).items():
            if attribute in skipped:
                continue
            for path, t in _tensors(value, owner + attribute, seen):
                key = _storage(t)
                name = by_storage.get(key) if key is not None else None
                if name is not None:
                    found.append((path, name))
    return found


def check_parameter_references(module: nn.Module) -> None:
    """Raises a ``ValueError`` naming each attribute that keeps a parameter or buffer where ``functional_call`` cannot
    swap it for a client's weights (:func:`hidden_parameter_references`)."""
    found = hidden_parameter_references(module)
    if found:
        named = ", ".join(f"{path} (aliases {name})" for path, name in found[:5]) + (", ..." if len(found) > 5 else "")
        raise ValueError(
            f"{PREFIX} swaps the module's registered parameters and buffers for each client's stacked weights, but "
            f"{type(module).__name__} keeps {len(found)} of them elsewhere: {named}. A loss term built over these reads "
            "the global weights and gets no gradient, so batched training would silently differ. Read the weights "
            "through the module in training_step (self.parameters(), self.named_parameters(), the layers), keep a "
            "copy (.detach().clone()) if a fixed anchor is meant, or use client_executor='lightning' or 'lean'."
        )


def _argument(args: tuple, kwargs: dict, where: tuple[int, str, Any]) -> Any:
    position, keyword, default = where
    return kwargs.get(keyword, args[position] if len(args) > position else default)


def _draws(func: Callable[..., Any], args: tuple, kwargs: dict) -> bool:
    """Whether the call ``func(*args, **kwargs)`` draws random numbers."""
    name = getattr(func, "__name__", "")
    if name in _ALWAYS_RANDOM:
        return True
    if name not in _RANDOM_IF:
        return False
    probability, training = _RANDOM_IF[name]
    return float(_argument(args, kwargs, probability)) > 0 and (training is None or bool(_argument(args, kwargs, training)))


class RandomCalls(TorchFunctionMode):
    """Within the block, notes the name of every torch function or tensor method called that draws random numbers
    (an inner call of one already noted is not seen: a handled function runs with the mode off)."""

    def __init__(self) -> None:
        super().__init__()
        self.names: set[str] = set()

    def __torch_function__(self, func: Callable[..., Any], types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if _draws(func, args, kwargs):
            owner = getattr(func, "__module__", None) or "Tensor"
            self.names.add(f"{owner}.{func.__name__}")
        return func(*args, **kwargs)


def dropout_modules(module: nn.Module) -> list[str]:
    """The names of the submodules that drop out in training mode: ``nn.Dropout*`` with ``p > 0``, recurrent layers
    and ``nn.MultiheadAttention`` with ``dropout > 0``."""
    def drops(m: nn.Module) -> bool:
        if isinstance(m, nn.modules.dropout._DropoutNd):
            return m.p > 0
        return isinstance(m, (nn.RNNBase, nn.MultiheadAttention)) and m.dropout > 0
    return [name or type(module).__name__ for name, m in module.named_modules() if m.training and drops(m)]


def warn_randomness(module: nn.Module, calls: list[str]) -> None:
    """Says once, naming the dropout modules and the random operations, that the batched executor's weights equal the
    sequential executors' in distribution only."""
    modules = dropout_modules(module)
    if not calls and not modules:
        return
    named = "; ".join(part for part in (
        f"dropout modules in training mode: {', '.join(modules[:8])}{', ...' if len(modules) > 8 else ''}" if modules else "",
        f"random operations: {', '.join(calls)}" if calls else "",
    ) if part)
    rank_zero_warn(
        f"{PREFIX}: {type(module).__name__}.training_step draws random numbers ({named}). Each client of a batched "
        "group draws its own (as if trained alone, at the same rates), but not the numbers client_executor='lightning' "
        "or 'lean' draw from the same seed, so the weights agree with theirs in distribution only, not to float "
        "rounding. For equal weights set the dropout probabilities to 0 (or the layers to eval mode), or use "
        "client_executor='lightning' or 'lean'."
    )

