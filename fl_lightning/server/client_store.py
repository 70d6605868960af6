"""The per-client state store: what an algorithm remembers about each client between rounds.

Control variates (SCAFFOLD), linear terms (FedDyn), personalised models (Ditto, FedSoft),
norm layers (FedBN), optimizer moments: every algorithm that remembers a client keeps it in a
:class:`ClientStore`, never in a dict of its own, so memory, checkpoints and client sharding are
handled in one place. Each entry is a flat :data:`~fl_lightning.server.model_state.State` (name ->
tensor) kept on the CPU in at least float32, never on the accelerator, whose memory would
otherwise grow with the number of clients.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import Tensor

from fl_lightning.server.model_state import State


def cpu_copy(tensors: Mapping[str, Tensor]) -> State:
    """Detached CPU copies; floating-point tensors in at least float32 (the master-copy rule)."""
    return {
        name: t.detach().to(
            device="cpu", dtype=torch.promote_types(t.dtype, torch.float32) if t.is_floating_point() else t.dtype, copy=True
        )
        for name, t in tensors.items()
    }


def state_nbytes(state: Mapping[str, Tensor]) -> int:
    """Bytes of the tensors of ``state``."""
    return sum(t.numel() * t.element_size() for t in state.values())


class ClientStore:
    """Client id -> that client's state (a flat name -> tensor mapping), on the CPU.

    The interface every stateful algorithm uses: :meth:`get`, :meth:`put`, ``in``, :meth:`ids`,
    :meth:`items`, and :meth:`state_dict` / :meth:`load_state_dict` for checkpoints. ``put`` stores
    CPU copies (:func:`cpu_copy`), so the caller may reuse or free what it passed.
    """

    def __init__(self) -> None:
        self._entries: dict[int, State] = {}

    def get(self, client_id: int) -> State | None:
        """Client ``client_id``'s state, or ``None`` if it has none yet."""
        return self._entries.get(client_id)

    def put(self, client_id: int, state: Mapping[str, Tensor]) -> None:
        """Stores (a CPU copy of) ``state`` as client ``client_id``'s, replacing any earlier one."""
        self._entries[int(client_id)] = cpu_copy(state)

    def __contains__(self, client_id: object) -> bool:
        return client_id in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def ids(self) -> list[int]:
        """The clients that have a state, in ascending order."""
        return sorted(self._entries)

    def items(self) -> Iterator[tuple[int, State]]:
        """``(client_id, state)`` pairs in ascending client order."""
        for cid in self.ids():
            yield cid, self._entries[cid]

    def nbytes(self) -> int:
        """Bytes held."""
        return sum(state_nbytes(s) for s in self._entries.values())

    def state_dict(self) -> dict[str, Any]:
        return {"entries": {cid: dict(s) for cid, s in self._entries.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._entries = {int(cid): {k: v.cpu() for k, v in s.items()} for cid, s in state["entries"].items()}
