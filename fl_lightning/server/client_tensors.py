"""The module's tensors that are not the round's shared model: each client's **local** tensors, and the
**frozen** buffers (:mod:`~fl_lightning.server.federated_parameters`).

The loop loads the shared global tensors into the module before each client; this puts the client's own
local tensors beside them (its entry in :attr:`ClientTensors.store`, or the initial ones before its first
round) and the frozen buffers back at their initial values, so that a frozen BatchNorm in training mode
passes nothing from one client to the next. After the round the module holds the *global model*: the
shared tensors, the frozen ones, and the initial local ones (as FedBN's authors keep the server's
BatchNorm); each client's own model is :meth:`ClientTensors.personalized_state`.
"""

from __future__ import annotations

from collections.abc import Mapping
from torch import Tensor

from fl_lightning.server.client_store import ClientStore, cpu_copy
from fl_lightning.server.federated_parameters import ParameterKinds
from fl_lightning.server.model_state import State, all_finite, load_into


class ClientTensors:
    """Per-client local tensors and the frozen buffers of one module.

    Args:
        kinds: the module's resolved selection.
        live: the module's tensors by ``state_dict`` name (sharing storage).
    """

    def __init__(self, kinds: ParameterKinds, live: Mapping[str, Tensor]) -> None:
        self.local = {name: live[name] for name in kinds.local}
        frozen_buffers = [name for name in kinds.frozen if name not in kinds.parameters]
        self._frozen_buffers = {name: live[name] for name in frozen_buffers}
        #: What the module holds between rounds besides the shared model (CPU copies, at least float32).
        self.initial: State = cpu_copy({**self.local, **self._frozen_buffers})
        #: Client id -> its local tensors after its last round.
        self.store = ClientStore()

    def __bool__(self) -> bool:
        return bool(self.initial)

    @property
    def frozen_buffers(self) -> Mapping[str, Tensor]:
        """The module's frozen buffers (live; a frozen BatchNorm's running statistics), at their initial values
        whenever a client starts."""
        return self._frozen_buffers

    def start(self, client_id: int) -> None:
        """Before ``client_id`` trains: its local tensors (or the initial ones) and the initial frozen buffers."""
        own = self.store.get(client_id) if self.local else None
        load_into(self._frozen_buffers, self.initial)
        load_into(self.local, own if own is not None else self.initial)

    def finish(self, client_id: int) -> None:
        """After ``client_id`` trained: keeps its local tensors, unless training made them non-finite (its update
        is then dropped too, and its previous tensors stay)."""
        if self.local and all_finite(self.local):
            self.store.put(client_id, self.local)

    def reset(self) -> None:
        """The module's local tensors and frozen buffers back to the global model's (the initial ones)."""
        load_into({**self.local, **self._frozen_buffers}, self.initial)

    def personalized_state(self, client_id: int) -> Mapping[str, Tensor] | None:
        """Client ``client_id``'s local tensors (``None`` before its first round), for federated evaluation."""
        return self.store.get(client_id) if self.local else None
