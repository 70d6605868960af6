r"""The loss terms of a batched group's clients (FedProx's centre, SCAFFOLD's and FedDyn's linear terms, FedMRN's masked
noise), stacked.

A term mixin (:class:`~fl_lightning.mixins.applied_term.AppliedTermMixin`) keeps references to the module's
parameters and the algorithm's per-client tensors (a centre, a direction). Under the batched executor the
weights it must read are each client's slice of the stacked weights, inside ``torch.vmap``, and the per-client
tensors differ between clients (SCAFFOLD's :math:`c - c_i`), as may a term's scalars (FedSoft's coefficient
:math:`\lambda U_k`, 0-d tensors: :attr:`~fl_lightning.mixins.applied_term.ClientTerm.scalars`). So, after each
member's ``configure_client``, the executor reads the set terms (:meth:`~fl_lightning.mixins.applied_term.AppliedTermMixin.client_term`), stacks
their tensors along the client dimension, and, within the vmapped loss, binds each mixin to the client's weights
and tensors (``term_bound_to``): the mixin's own ``training_step`` then adds the same term, with the same
arithmetic, as under the sequential executors. A term that changes every step (FedMRN's masked noise, drawn from each
client's own generator) gives its stacked tensors before each step (``step_tensors``), and is set again on the module
for each client as it finishes (``resume_client_term``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager

import torch
from torch import Tensor

from fl_lightning.mixins.applied_term import AppliedTermMixin, ClientTerm

#: ``(per_client, shared)``: by mixin name, by parameter name, the tensors that differ between the group's clients
#: (stacked, leading client dimension) and those every client shares (a FedProx centre: the global weights, once).
TermInputs = tuple[dict[str, dict[str, Tensor]], dict[str, dict[str, Tensor]]]

PREFIX = "client_executor='batched'"


def _mixins(module: object) -> dict[str, type[AppliedTermMixin]]:
    """The mixins of ``module`` whose term is set, by name."""
    if not isinstance(module, AppliedTermMixin):
        return {}
    return {mixin.__name__: mixin for mixin in module.applied_term_steps}


def _settings(terms: Mapping[str, ClientTerm]) -> dict[str, tuple[tuple[float, ...], tuple[str, ...]]]:
    """What every member of a group shares, by mixin name: the term's settings and the names of its scalars."""
    return {name: (term.settings, tuple(term.scalars)) for name, term in terms.items()}


def _stacked(term: ClientTerm) -> dict[str, Tensor]:
    """The tensors of ``term`` that are stacked over a group's clients: per parameter, and its scalars."""
    return {**term.tensors, **term.scalars}


class GroupTerms:
    """Collects the set terms of a group's members, one :meth:`add` per member after its ``configure_client`` (and
    ``on_client_start``, where a callback may set one); :meth:`inputs` stacks them, :meth:`bound` applies them."""

    def __init__(self) -> None:
        self._clients: list[dict[str, ClientTerm]] = []
        self._ids: list[int] = []
        #: Each member's set mixins by name (a member's term may be unset by the time it finishes).
        self._mixins: list[dict[str, type[AppliedTermMixin]]] = []
        self._order: list[int] = []
        #: The members' mixins whose term changes every step (they override ``step_tensors``), by name.
        self.stepping: dict[str, type[AppliedTermMixin]] = {}

    def add(self, module: object, client_id: int) -> None:
        """Reads the terms set for ``client_id``; raises a ``ValueError`` for one the batched executor cannot stack,
        or one that differs from the first member's in which terms are set, in their settings (FedMRN's mask options) or
        in the names of their per-client scalars (a multi-centre constant); the scalars' values may differ."""
        terms: dict[str, ClientTerm] = {}
        mixins = _mixins(module)
        for name, mixin in mixins.items():
            term = mixin.client_term(module)
            if term is None:
                raise ValueError(
                    f"{PREFIX} cannot stack the term of {name} set for client {client_id}: only ProximalMixin's and "
                    "LinearTermMixin's terms are stacked per client. Use client_executor='lightning' or 'lean'."
                )
            terms[name] = term
        if self._clients:
            first, first_id = self._clients[0], self._ids[0]
            settings, first_settings = _settings(terms), _settings(first)
            if settings != first_settings:
                raise ValueError(
                    f"{PREFIX} trains a group of clients with one setting per term; client {client_id} has the terms "
                    f"{settings} (mixin: (settings, per-client scalars)), client {first_id} {first_settings}. Use client_executor='lightning' or 'lean'."
                )
        self._clients.append(terms)
        self._ids.append(client_id)
        self._mixins.append(mixins)
        if len(self._mixins) == 1:
            self.stepping = {n: m for n, m in mixins.items() if m.step_tensors is not AppliedTermMixin.step_tensors}

    def inputs(self, order: Sequence[int], device: torch.device) -> TermInputs:
        """The terms' tensors: stacked on ``device`` over the members in ``order`` (positions in :meth:`add`'s
        order), or once where every member holds the same tensor (one storage). :meth:`step` keeps ``order``."""
        self._order = list(order)
        per_client: dict[str, dict[str, Tensor]] = {}
        shared: dict[str, dict[str, Tensor]] = {}
        for mixin in self._clients[0] if self._clients else {}:
            members = [_stacked(self._clients[j][mixin]) for j in order]  # each member's tensors and scalars, once
            for name in members[0]:
                tensors = [member[name] for member in members]
                first = tensors[0]
                if all(t.data_ptr() == first.data_ptr() and t.shape == first.shape and t.stride() == first.stride() for t in tensors):
                    shared.setdefault(mixin, {})[name] = first.to(device)
                else:
                    per_client.setdefault(mixin, {})[name] = torch.stack(tensors).to(device)
        return per_client, shared

    def step(self, module: object, weights: Mapping[str, Tensor], active: int, width: int) -> dict[str, dict[str, Tensor]]:
        """This step's tensors of the terms that change every step, by mixin, from the first ``active`` rows of the
        stacked ``weights`` (by name) in :meth:`inputs`' order; ``width - active`` rows of zeros after them (a compiled
        step's finished clients, whose updates are dropped)."""
        stepped: dict[str, dict[str, Tensor]] = {}
        for name, mixin in self.stepping.items():
            terms = [self._clients[j][name] for j in self._order[:active]]
            tensors = mixin.step_tensors(module, terms, weights)  # type: ignore[arg-type]
            if tensors:
                stepped[name] = {
                    n: t if width == active else torch.cat([t, t.new_zeros(width - active, *t.shape[1:])])
                    for n, t in tensors.items()
                }
        return stepped

    def resume(self, module: object, position: int) -> None:
        """Sets the terms of the member at ``position`` (in :meth:`add`'s order) on ``module`` again, before it finishes."""
        for name, mixin in self._mixins[position].items():
            mixin.resume_client_term(module, self._clients[position][name])  # type: ignore[arg-type]


@contextmanager
def bound(module: object, params: Mapping[str, Tensor], per_client: Mapping[str, Mapping[str, Tensor]],
          shared: Mapping[str, Mapping[str, Tensor]]) -> Iterator[None]:
    """Within the block, each set term of ``module`` reads ``params`` (one client's weights, by name) and its
    tensors from ``per_client`` (that client's slices) and ``shared``."""
    with ExitStack() as stack:
        for name, mixin in _mixins(module).items():
            tensors = {**shared.get(name, {}), **per_client.get(name, {})}
            stack.enter_context(mixin.term_bound_to(module, params, tensors))  # type: ignore[arg-type]
        yield
