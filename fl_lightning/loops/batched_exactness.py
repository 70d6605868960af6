"""What would make the batched executor's weights differ from the sequential executors' by more than float rounding,
refused before the first step (:func:`check_parameter_references`, :func:`check_group_settings`) or named once, when the
fit starts (:func:`warn_dropout`) and as the first step runs (:func:`warn_random_calls`).

*Parameter references.* The batched executor runs ``training_step`` through ``torch.func.functional_call``, which
swaps the tensors registered in the module's ``_parameters`` and ``_buffers`` for each client's slice of the stacked
weights. A tensor the module keeps anywhere else (``self.anchor = [p.detach() for p in self.parameters()]``,
``self.params = list(self.parameters())``, a ``SimpleNamespace`` or a closure over such a list) still points at the
real weights, so a loss term built over it reads the global weights, gets no gradient, and the run trains another loss
with no error. The library's own term mixins keep such references too
(:class:`~fl_lightning.mixins.applied_term.AppliedTermMixin`) and rebind them per client
(:mod:`~fl_lightning.loops.batched_terms`); everything else is refused.

*Optimizer settings.* The stacked update reads each parameter group's settings (``lr``, ``momentum``, ``betas``, ...)
once for the whole group of clients, so a setting that a callback or ``configure_client`` sets per client would give
every client one member's value; a group whose members' settings differ is refused.

*Randomness.* Under ``vmap(randomness="different")`` each client draws its own random numbers (dropout masks, noise),
as if trained alone, but not the numbers the sequential executors draw from the same seed: the weights agree in
distribution, not to float rounding (an audit measured 0.14 with dropout). This is warned, naming the modules and the
random operations, rather than refused: each client's training is still a correct draw of the same procedure (the same
rates, independent masks), as a change of seed is, and refusing would keep every model with dropout (most
transformers, the LoRA recipes) off the executor that exists for speed.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode
from torch.utils.hooks import RemovableHandle

from fl_lightning.loops.batched_adam import ADAM_OPTIONS
from fl_lightning.loops.batched_sgd import SGD_OPTIONS
from fl_lightning.mixins.applied_term import AppliedTermMixin

__all__ = [
    "RandomCalls", "check_group_settings", "check_parameter_references", "dropout_modules", "hidden_parameter_references",
    "optimizer_settings", "warn_dropout", "warn_random_calls",
]

PREFIX = "client_executor='batched'"

#: ``nn.Module`` slots that ``functional_call`` swaps (or that hold submodules, scanned one by one).
_SWAPPED_SLOTS = frozenset({"_parameters", "_buffers", "_modules"})

#: Packages whose objects the parameter scan does not enter, beyond their plain containers: what a trainer, its
#: optimizers, loggers and metrics, or the library's own loop state keep of the weights is theirs to keep.
_LIBRARIES = frozenset({
    "torch", "lightning", "pytorch_lightning", "lightning_fabric", "lightning_utilities", "torchmetrics", "fl_lightning",
})
_UNSET = object()

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


def _is_library(name: str | None) -> bool:
    """Whether the module ``name`` belongs to a package in :data:`_LIBRARIES`."""
    return (name or "").partition(".")[0] in _LIBRARIES


@functools.cache
def _library_type(cls: type) -> bool:
    """Whether ``cls`` or a base class comes from a package in :data:`_LIBRARIES`."""
    return any(_is_library(base.__module__) for base in cls.__mro__)


def _attributes(value: object) -> dict[str, Any]:
    """``value``'s instance attributes: its ``__dict__`` and its ``__slots__``' set values."""
    attributes = dict(getattr(value, "__dict__", {}))
    for cls in type(value).__mro__:
        slots = vars(cls).get("__slots__", ())
        for name in (slots,) if isinstance(slots, str) else slots:
            item = _UNSET if name in ("__dict__", "__weakref__") else getattr(value, name, _UNSET)
            if item is not _UNSET:  # an unset slot has no value
                attributes[name] = item
    return attributes


def _references(value: Any, path: str) -> list[tuple[str, Any]]:
    """What ``value`` refers to, with paths: a container's items; a function's closure cells and defaults (one defined
    outside the libraries); a bound method's object and function; a partial's function and arguments; an ordinary
    object's attributes. Not entered: modules (scanned on their own), classes, Python modules, and objects of the
    libraries (a trainer, its optimizers and loggers hold the weights for their own reasons)."""
    if isinstance(value, dict):
        return [(f"{path}[{key!r}]", item) for key, item in value.items()]
    if isinstance(value, (list, tuple, set, frozenset)):
        return [(f"{path}[{i}]", item) for i, item in enumerate(value)]
    if isinstance(value, (nn.Module, type, types.ModuleType, str, bytes, int, float, complex)) or value is None:
        return []
    if isinstance(value, types.FunctionType):
        if _is_library(value.__module__):
            return []
        cells = zip(value.__code__.co_freevars, value.__closure__ or ())
        closure = [(f"{path}.<closure {name}>", _contents(cell)) for name, cell in cells]
        return [*closure, (f"{path}.__defaults__", value.__defaults__), (f"{path}.__kwdefaults__", value.__kwdefaults__)]
    if isinstance(value, types.MethodType):
        return [(f"{path}.__self__", value.__self__), (f"{path}.__func__", value.__func__)]
    if isinstance(value, functools.partial):
        return [(f"{path}.func", value.func), (f"{path}.args", value.args), (f"{path}.keywords", value.keywords)]
    if _library_type(type(value)):
        return []
    return [(f"{path}.{name}", item) for name, item in _attributes(value).items()]


def _contents(cell: types.CellType) -> Any:
    """A closure cell's value; ``None`` for a variable not yet assigned."""
    try:
        return cell.cell_contents
    except ValueError:
        return None


def _tensors(value: Any, path: str, seen: set[int]) -> Iterator[tuple[str, Tensor]]:
    """The tensors ``value`` reaches (:func:`_references`, depth first, each object once), with their paths."""
    stack = [(path, value)]
    while stack:
        path, value = stack.pop()
        if id(value) in seen:
            continue
        seen.add(id(value))
        if isinstance(value, Tensor):
            yield path, value
        else:
            stack.extend(reversed(_references(value, path)))


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


def optimizer_settings(optimizer: torch.optim.Optimizer) -> list[dict[str, Any]]:
    """Each parameter group's settings that the batched update reads (``SGD_OPTIONS``, ``ADAM_OPTIONS``), tensors as
    numbers."""
    options = SGD_OPTIONS if isinstance(optimizer, torch.optim.SGD) else ADAM_OPTIONS
    return [{key: _plain(group[key]) for key in options if key in group} for group in optimizer.param_groups]


def _plain(value: Any) -> Any:
    """``value`` with its tensors as numbers (``lr=torch.tensor(0.1)``), so that settings compare by value."""
    if isinstance(value, Tensor):
        return value.tolist()
    return tuple(map(_plain, value)) if isinstance(value, tuple) else value


def _shown(value: Any) -> Any:
    """``value`` as an error shows it: floats to 12 significant digits (``0.15``, not ``0.15000000000000002``)."""
    if isinstance(value, float):
        return float(f"{value:.12g}")
    return tuple(map(_shown, value)) if isinstance(value, (tuple, list)) else value


def check_group_settings(settings: dict[int, list[dict[str, Any]]]) -> None:
    """Raises a ``ValueError`` naming each optimizer setting that differs between a group's clients (``settings``: by
    client id, each one's :func:`optimizer_settings` after its ``configure_client`` and ``on_client_start``)."""
    first = next(iter(settings.values()), [])
    differing = {
        f"param_groups[{j}][{key!r}]": {client: groups[j][key] for client, groups in settings.items()}
        for j, group in enumerate(first) for key, value in group.items()
        if any(groups[j][key] != value for groups in settings.values())
    }  # fmt: skip
    if differing:
        named = "; ".join(
            f"{name}: {', '.join(f'client {client}: {_shown(value)!r}' for client, value in values.items())}"
            for name, values in differing.items()
        )
        raise ValueError(
            f"{PREFIX} steps a group of clients with one value of each optimizer setting, read once for the group, but "
            f"its clients set different ones as they start (in on_client_start or configure_client): {named}. Every "
            "client would silently train with one of these values. Give every client the same settings, or use "
            "client_executor='lean' or 'lightning'."
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
    """Within the block, notes the name of every torch function or tensor method called that draws random numbers,
    outside the forward passes of the ``skipped`` modules (an inner call of one already noted is not seen: a handled
    function runs with the mode off)."""

    def __init__(self, skipped: Sequence[nn.Module] = ()) -> None:
        super().__init__()
        self.names: set[str] = set()
        self._skipped = skipped
        self._hooks: list[RemovableHandle] = []
        #: The forward passes of skipped modules under way.
        self._inside = 0

    def __enter__(self) -> RandomCalls:
        for m in self._skipped:
            self._hooks.append(m.register_forward_pre_hook(self._enter_skipped))
            self._hooks.append(m.register_forward_hook(self._leave_skipped, always_call=True))
        return super().__enter__()

    def __exit__(self, *exc_info: Any) -> None:
        for hook in self._hooks:
            hook.remove()
        self._hooks.clear()
        super().__exit__(*exc_info)

    def _enter_skipped(self, *_: Any) -> None:
        self._inside += 1

    def _leave_skipped(self, *_: Any) -> None:
        self._inside -= 1

    def __torch_function__(self, func: Callable[..., Any], types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if not self._inside and _draws(func, args, kwargs):
            owner = getattr(func, "__module__", None) or "Tensor"
            self.names.add(f"{owner}.{func.__name__}")
        return func(*args, **kwargs)


def dropout_modules(module: nn.Module) -> dict[str, nn.Module]:
    """The submodules that drop out in training mode, by name: ``nn.Dropout*`` with ``p > 0``, recurrent layers and
    ``nn.MultiheadAttention`` with ``dropout > 0``."""
    def drops(m: nn.Module) -> bool:
        if isinstance(m, nn.modules.dropout._DropoutNd):
            return m.p > 0
        return isinstance(m, (nn.RNNBase, nn.MultiheadAttention)) and m.dropout > 0
    return {name or type(module).__name__: m for name, m in module.named_modules() if m.training and drops(m)}


def warn_dropout(module: nn.Module) -> list[nn.Module]:
    """Says once, when the fit starts, naming them, that the module's dropout modules in training mode make the
    batched executor's weights equal the sequential executors' in distribution only; returns those modules."""
    modules = dropout_modules(module)
    names = list(modules)
    if names:
        named = f"dropout modules in training mode: {', '.join(names[:8])}{', ...' if len(names) > 8 else ''}"
        _warn_randomness(module, named, "set the dropout probabilities to 0 (or the layers to eval mode)")
    return list(modules.values())


def warn_random_calls(module: nn.Module, calls: Sequence[str]) -> None:
    """Says once, naming the random operations ``training_step`` called (other than its dropout modules'), that the
    batched executor's weights equal the sequential executors' in distribution only."""
    if calls:
        _warn_randomness(module, f"random operations: {', '.join(calls)}", "take the random draws out of training_step")


def _warn_randomness(module: nn.Module, named: str, remedy: str) -> None:
    rank_zero_warn(
        f"{PREFIX}: {type(module).__name__}.training_step draws random numbers ({named}). Each client of a batched "
        "group draws its own (as if trained alone, at the same rates), but not the numbers client_executor='lightning' "
        "or 'lean' draw from the same seed, so the weights agree with theirs in distribution only, not to float "
        f"rounding. For equal weights {remedy}, or use client_executor='lightning' or 'lean'."
    )
