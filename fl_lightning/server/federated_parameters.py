"""What is federated: each of a module's tensors is **shared**, **frozen** or **local**, decided once at set-up.

* **shared**: trained by the clients, sent (their deltas), aggregated, stepped by the server optimizer,
  clipped and noised by DP, masked or encoded by a codec, and covered by every algorithm's state
  (control variates, server-optimizer moments). This is "the model" of a round.
* **frozen**: never trained, sent, aggregated, noised, masked or held in algorithm state: a LoRA base, a
  frozen backbone. Its tensors stay in the module as they were built.
* **local**: trained, and kept per client in the client store between its rounds, never sent: FedBN's
  BatchNorm layers, FedPer's personal head.

Default: a parameter that requires grad is shared, one that does not is frozen; a buffer follows the
parameters of the module that holds it (all frozen: frozen; all local: local; otherwise, or with no
parameters, shared). One tensor object is one tensor, however many ``state_dict`` names it has: tied
embeddings (GPT-2's ``lm_head.weight`` is ``transformer.wte.weight``) are sent, aggregated and stepped
once, under the first name; the others are *aliases*.

Users (and algorithms such as FedBN and FedPer) select by pattern, from Python or YAML::

    FederatedTrainer(federated_parameters=FederatedParameters(local=["head"], frozen=["backbone.*"]))

A pattern matches a ``state_dict`` name (``fnmatch``: ``"head.*"``, ``"*.bias"``), a module name (``"head"``
selects every tensor of the submodule ``head``), or a module class anywhere along its class hierarchy
(``"BatchNorm2d"``, ``"_BatchNorm"`` for every BatchNorm, ``"torch.nn.LayerNorm"``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Literal

from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor, nn

from fl_lightning.server.model_state import State
from fl_lightning.utils.init_args import RecordsInitArgs

Kind = Literal["shared", "frozen", "local"]
KINDS: tuple[Kind, ...] = ("shared", "frozen", "local")


@dataclass(frozen=True)
class ParameterKinds:
    """The resolved selection: every ``state_dict`` name of the module, by kind.

    Attributes:
        shared, frozen, local: canonical names (one per tensor object) of each kind, in ``state_dict`` order.
        aliases: every further name of a tied tensor -> its canonical name.
        parameters: the canonical names that are ``nn.Parameter``s (the rest are buffers).
    """

    shared: tuple[str, ...]
    frozen: tuple[str, ...]
    local: tuple[str, ...]
    aliases: Mapping[str, str]
    parameters: frozenset[str]

    def of(self, kind: Kind) -> tuple[str, ...]:
        return {"shared": self.shared, "frozen": self.frozen, "local": self.local}[kind]

    def canonical(self, name: str) -> str:
        """``name``, or the canonical name of the tensor it aliases."""
        return self.aliases.get(name, name)

    def summary_line(self, tensors: Mapping[str, Tensor]) -> str:
        """E.g. ``shared 22,528 (24 tensors), frozen 491,520 (29), local 0 (0); 1 tied name``."""
        counts = self.summary(tensors)
        kinds = ", ".join(
            f"{kind} {counts[f'{kind}_values']:,} ({counts[f'{kind}_tensors']}{' tensors' if kind == 'shared' else ''})"
            for kind in KINDS
        )
        tied = counts["tied_names"]
        return kinds + (f"; {tied} tied name{'s' if tied > 1 else ''}" if tied else "")

    def describe(self, name: str) -> str:
        """What ``name`` is, in words: ``"shared"``, ``"frozen"``, ``"local"``, ``"an alias of `x` (shared)"``, or
        ``"no tensor of the module"``."""
        if name in self.aliases:
            return f"an alias of `{self.aliases[name]}` ({self.describe(self.aliases[name])})"
        return next((kind for kind in KINDS if name in self.of(kind)), "no tensor of the module")

    @property
    def shared_parameters(self) -> frozenset[str]:
        """Shared names that are parameters: what a server optimizer steps (buffers take the plain delta)."""
        return self.parameters.intersection(self.shared)

    def summary(self, tensors: Mapping[str, Tensor]) -> dict[str, int]:
        """``{kind}_tensors`` and ``{kind}_values`` per kind, and ``tied_names``: for the fit summary and hparams."""
        counts: dict[str, int] = {}
        for kind in KINDS:
            names = self.of(kind)
            counts[f"{kind}_tensors"] = len(names)
            counts[f"{kind}_values"] = sum(tensors[n].numel() for n in names)
        counts["tied_names"] = len(self.aliases)
        return counts


class FederatedParameters(RecordsInitArgs):
    """A selection of which tensors are shared, frozen or local (module docstring: the rules and patterns).

    Args:
        local: patterns of the tensors each client keeps for itself (trained, never sent).
        frozen: patterns of the tensors nobody trains or sends; they must not require grad (a frozen
            tensor that trained would carry one client's training into the next).
        shared: patterns forced shared, e.g. a buffer of a frozen module that should be averaged.

    Every pattern must select at least one tensor, and no tensor may be selected as two kinds.

    Example::

        >>> import torch
        >>> net = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2), torch.nn.Linear(2, 1))
        >>> kinds = FederatedParameters(local=["BatchNorm1d"]).resolve(net)
        >>> kinds.local
        ('1.weight', '1.bias', '1.running_mean', '1.running_var', '1.num_batches_tracked')
        >>> kinds.shared
        ('0.weight', '0.bias', '2.weight', '2.bias')
    """

    def __init__(self, *, local: Sequence[str] = (), frozen: Sequence[str] = (), shared: Sequence[str] = ()) -> None:
        self.patterns: dict[Kind, tuple[str, ...]] = {}
        for kind, given in (("local", local), ("frozen", frozen), ("shared", shared)):
            # Read once: a generator checked and then stored would be stored empty.
            patterns = tuple(given) if isinstance(given, Iterable) and not isinstance(given, str) else None
            if patterns is None or not all(isinstance(p, str) and p for p in patterns):
                shown = given if patterns is None else patterns
                raise ValueError(f"`FederatedParameters({kind}=...)` takes a list of non-empty patterns, got {shown!r}.")
            self.patterns[kind] = patterns
        #: Who asked for each pattern that is not the user's (an algorithm's name), for error messages.
        self.origins: dict[str, str] = {}

    def merged(self, other: FederatedParameters, *, origin: str) -> FederatedParameters:
        """This selection plus ``other``'s patterns, which ``origin`` (an algorithm, e.g. FedBN) asks for."""
        merged = FederatedParameters(**{kind: (*self.patterns[kind], *other.patterns[kind]) for kind in KINDS})
        merged.origins = {**self.origins, **{p: origin for kind in KINDS for p in other.patterns[kind]}}
        return merged

    def resolve(self, module: nn.Module) -> ParameterKinds:
        """Every ``state_dict`` name of ``module`` by kind.

        Raises:
            ValueError: naming a pattern that selects nothing, a tensor selected as two kinds, or a frozen
                tensor that requires grad.

        Warns (once per call, naming them all) about parameters the user selects as local that do not require grad.
        """
        tensors = module.state_dict(keep_vars=True)
        owners = _owners(module, tensors)
        canonical: dict[int, str] = {}
        aliases = {name: canonical.setdefault(id(t), name) for name, t in tensors.items()}
        aliases = {name: first for name, first in aliases.items() if name != first}
        explicit = self._explicit(module, tensors, owners)
        parameter_ids = {id(p) for p in module.parameters()}
        kinds: dict[str, Kind] = {}
        for name, t in tensors.items():
            first = aliases.get(name, name)
            if first != name:
                if explicit.get(name, kinds[first]) != kinds[first]:
                    raise ValueError(
                        f"`{name}` is the same tensor as `{first}` (tied weights), which is {kinds[first]}: it cannot be "
                        f"{explicit[name]}; select both names as one kind."
                    )
                continue
            kinds[name] = explicit.get(name) or _default_kind(t, id(t) in parameter_ids)
        for name in tensors:  # buffers without an explicit kind follow their module's parameters
            if name not in aliases and name not in explicit and id(tensors[name]) not in parameter_ids:
                kinds[name] = _buffer_kind(owners[name], kinds)
        for name, kind in kinds.items():
            if kind == "frozen" and tensors[name].requires_grad:
                raise ValueError(
                    f"`{name}` is selected as frozen but requires grad: each client would train it and pass its "
                    "training on to the next client. Set `requires_grad_(False)` on it, or select it as local or shared."
                )
        self._warn_untrained_local(kinds, tensors, owners, parameter_ids)
        by_kind = {kind: tuple(n for n, k in kinds.items() if k == kind) for kind in KINDS}
        names = {id(t): n for n, t in tensors.items() if n not in aliases}
        parameters = frozenset(names[i] for i in parameter_ids if i in names)
        return ParameterKinds(**by_kind, aliases=aliases, parameters=parameters)

    def _warn_untrained_local(
        self,
        kinds: Mapping[str, Kind],
        tensors: Mapping[str, Tensor],
        owners: Mapping[str, tuple[str, nn.Module]],
        parameter_ids: set[int],
    ) -> None:
        """One warning naming every parameter the user's own patterns select as local that does not require grad:
        no client trains it, so the client store keeps a copy of the initial value per client for nothing.

        A warning, not a refusal: nothing is computed wrong (unlike a frozen tensor that trains), and code that updates
        such a parameter in place still keeps it per client. Buffers are exempt (BatchNorm statistics change without
        grad), and so are an algorithm's patterns (FedBN keeps every BatchNorm tensor local by design; the user cannot
        select those frozen).
        """
        user_patterns = [p for p in self.patterns["local"] if p not in self.origins]
        untrained = [
            name
            for name, kind in kinds.items()
            if kind == "local" and id(tensors[name]) in parameter_ids and not tensors[name].requires_grad
            and any(_matches(p, name, *owners[name]) for p in user_patterns)
        ]  # fmt: skip
        if untrained:
            rank_zero_warn(
                f"FederatedParameters selects as local parameters that do not require grad: {untrained}. No client "
                "trains them, so each client's copy stays the initial value, stored per client for nothing. Select "
                "them as frozen (never sent or stored per client), or call `requires_grad_(True)` on them to train them."
            )

    def _explicit(
        self, module: nn.Module, tensors: Mapping[str, Tensor], owners: Mapping[str, tuple[str, nn.Module]]
    ) -> dict[str, Kind]:
        chosen: dict[str, Kind] = {}
        for kind in KINDS:
            for pattern in self.patterns[kind]:
                matched = [name for name in tensors if _matches(pattern, name, *owners[name])]
                if not matched:
                    near = [name for name in tensors if pattern.strip("*.").lower() in name.lower()][:4]
                    hint = f"; names containing it: {near} (a module name matches from the root)" if near else ""
                    who = f"{self.origins[pattern]} keeps" if pattern in self.origins else "FederatedParameters selects"
                    raise ValueError(
                        f"{who} {kind} tensors by {pattern!r}, which matches no tensor of {type(module).__name__}: a "
                        f"pattern matches a state_dict name, a module name or a module class; the names start "
                        f"{list(tensors)[:4]}{hint}."
                    )
                for name in matched:
                    if chosen.setdefault(name, kind) != kind:
                        raise ValueError(f"`{name}` is selected as both {chosen[name]} and {kind} (pattern {pattern!r}).")
        return chosen


def _owners(module: nn.Module, tensors: Iterable[str]) -> dict[str, tuple[str, nn.Module]]:
    """Each ``state_dict`` name's owning submodule, with that submodule's name."""
    modules = dict(module.named_modules(remove_duplicate=False))
    return {name: (owner, modules[owner]) for name in tensors for owner in [name.rpartition(".")[0]]}


def _matches(pattern: str, name: str, owner_name: str, owner: nn.Module) -> bool:
    if fnmatchcase(name, pattern) or fnmatchcase(owner_name, pattern):
        return True
    module_prefix = pattern + "."
    if name.startswith(module_prefix):
        return True
    class_name = pattern.rpartition(".")[2]
    return any(cls.__name__ == class_name for cls in type(owner).__mro__) and class_name.isidentifier()


def _default_kind(tensor: Tensor, is_parameter: bool) -> Kind:
    return ("shared" if tensor.requires_grad else "frozen") if is_parameter else "shared"


def _buffer_kind(owner: tuple[str, nn.Module], kinds: Mapping[str, Kind]) -> Kind:
    prefix = f"{owner[0]}." if owner[0] else ""
    own = {kinds[prefix + n] for n, _ in owner[1].named_parameters(recurse=False) if prefix + n in kinds}
    return own.pop() if len(own) == 1 else "shared"


def shared_tensors(kinds: ParameterKinds, tensors: Mapping[str, Tensor]) -> State:
    """``tensors`` (a module's ``state_dict`` or live tensors) restricted to the shared canonical names."""
    return {name: tensors[name] for name in kinds.shared}
