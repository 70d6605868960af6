"""The guard against a mixin that never runs: each client-side mixin counts the training steps that went
through its ``training_step`` while its term is set, and the client executors check the counts.

A ``training_step`` defined in the class that lists a mixin replaces the mixin's (Python's method
resolution order), so the term is never added and the algorithm silently degrades to FedAvg.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

from torch import Tensor


@dataclass(frozen=True)
class ClientTerm:
    """One client's set term as the batched executor stacks it (:mod:`~fl_lightning.loops.batched_terms`).

    Attributes:
        tensors: the term's per-parameter tensors by parameter name (a proximal centre, a linear direction).
        settings: the term's scalars that every client of a batched group must share (FedMRN's mask options).
        state: the client's own state of a term that changes every step (:meth:`AppliedTermMixin.step_tensors`:
            FedMRN's mask generator and step counter); ``None`` for a term fixed for the round.
        scalars: the term's 0-d tensors that may differ between the group's clients (a proximal coefficient,
            FedSoft's lambda * U_k, and its constant), stacked and bound as :attr:`tensors` are, under names that start with
            ``"."``, which no parameter's name does; every client of a group must give the same names.
    """

    tensors: dict[str, Tensor]
    settings: tuple[float, ...] = ()
    state: Any = None
    scalars: dict[str, Tensor] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if bad := [name for name in self.scalars if not name.startswith(".")]:
            raise ValueError(f"A term's per-client scalars are named with a leading '.' (no parameter's name has one), got {bad}.")


class AppliedTermMixin:
    """Shared base of the mixins whose ``training_step`` adds a term: which terms are set, and the
    training steps that applied each since it was set (one count per mixin, so mixins compose)."""

    #: Steps that applied each set term since it was set, by mixin; a mixin whose term is unset is absent.
    _applied_term_steps: dict[type, int] = {}

    def _set_term(self, mixin: type, active: bool, steps: int = 0) -> None:
        """Starts counting ``mixin``'s steps from ``steps`` when its term is set (``active``), stops when it is removed."""
        counts = {k: v for k, v in self._applied_term_steps.items() if k is not mixin}  # per instance, never the class's
        self._applied_term_steps = {**counts, mixin: steps} if active else counts

    def _count_term_step(self, mixin: type) -> None:
        """Records that a training step applied ``mixin``'s term."""
        self._applied_term_steps[mixin] += 1

    def client_term(self) -> ClientTerm | None:
        """The set term of this mixin for the client being configured; ``None``: the batched executor cannot stack
        it. Called through the mixin's class (``ProximalMixin.client_term(module)``): each mixin defines its own."""
        return None

    def term_bound_to(self, params: Mapping[str, Tensor], tensors: Mapping[str, Tensor]) -> AbstractContextManager[None]:
        """A context within which this mixin's term reads the weights ``params`` and the term tensors ``tensors`` (one
        client's slices under ``torch.vmap``) by parameter name. Called through the mixin's class, as :meth:`client_term`;
        only for a mixin whose :meth:`client_term` gives one."""
        raise NotImplementedError(f"{type(self).__name__} has no term the batched executor can stack")

    def step_tensors(self, terms: Sequence[ClientTerm], weights: Mapping[str, Tensor]) -> dict[str, Tensor]:
        """This step's tensors of a term that changes every step, stacked over the clients still training: row ``j``
        from ``terms[j]`` (its :meth:`client_term`, whose ``state`` it advances) and row ``j`` of ``weights`` (the module's
        stacked tensors by name, every client of the group: the first ``len(terms)`` rows are those still training);
        :meth:`term_bound_to` then reads row ``j`` with the term's own tensors. Called
        through the mixin's class, as :meth:`client_term`, once per step, before the step. Default: none (fixed term)."""
        return {}

    def resume_client_term(self, term: ClientTerm) -> None:
        """Sets ``term`` (a client's :meth:`client_term`, after its batched steps) on the module again, before that client
        finishes: the module held the last started client's term while the group trained. Default: nothing to set."""

    @property
    def applied_term_steps(self) -> dict[type, int]:
        """Training steps that applied each set term since it was set, by mixin: 0 after a client trained means the
        module's own ``training_step`` bypassed the mixin's (the mixin is not first among the bases)."""
        return dict(self._applied_term_steps)


StepT = TypeVar("StepT", bound=Callable[..., Any])


def term_step(step: StepT) -> StepT:
    """Marks a term mixin's ``training_step`` that returns the next class's output unchanged while the mixin's term is
    unset (the mixin absent from :attr:`AppliedTermMixin.applied_term_steps`): :func:`step_past_unset_terms` skips it."""
    step.__passes_unset_term__ = True  # type: ignore[attr-defined]
    return step


def step_past_unset_terms(module: Any) -> Callable[..., Any]:
    """``module.training_step``, bound, past the leading term mixins' steps (:func:`term_step`) whose term is unset:
    the same output, one Python frame fewer per mixin and step (the lean executor resolves it once per client). An
    instance's own ``training_step``, or a subclass's override of a mixin's, is never skipped."""
    if not isinstance(module, AppliedTermMixin) or "training_step" in vars(module):
        return module.training_step
    for cls in type(module).__mro__:
        step = vars(cls).get("training_step")
        if step is None or (getattr(step, "__passes_unset_term__", False) and cls not in module._applied_term_steps):
            continue
        return step.__get__(module, type(module))
    return module.training_step


def set_terms(module: object) -> list[str]:
    """The names of the mixins of ``module`` whose term is set."""
    return [mixin.__name__ for mixin in module.applied_term_steps] if isinstance(module, AppliedTermMixin) else []


def check_terms_applied(module: object, steps: int, algorithm: object) -> None:
    """Raises ``TypeError`` naming the fix when ``module`` trained ``steps > 0`` steps and a mixin whose term is set
    applied it in none of them: a ``training_step`` defined in the class that lists the mixin replaces the mixin's."""
    if not steps or not isinstance(module, AppliedTermMixin) or not module._applied_term_steps:
        return  # no step, or no term set
    mro = type(module).__mro__  # the fix keeps the mixins' order among the bases
    bypassed = [m.__name__ for m, count in sorted(module.applied_term_steps.items(), key=lambda t: mro.index(t[0])) if not count]
    if bypassed:
        name = type(module).__name__
        raise TypeError(
            f"{name}.training_step bypasses {' and '.join(f'{m}.training_step' for m in bypassed)}, so "
            f"{type(algorithm).__name__}'s term was never applied in {steps} training step(s): define training_step "
            f"in a base class and put the mixin first among the bases, e.g. class Fixed({', '.join(bypassed)}, {name}), "
            "or call super().training_step() from it."
        )


@contextmanager
def attribute_set(owner: object, name: str, value: Any) -> Iterator[None]:
    """``owner.<name>`` is ``value`` within the block, and back to what it was after."""
    previous = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, previous)
