"""Per-client server state kept in host memory: personalised models and optimizer state.

Algorithms that remember something per client (FedSoft's personalised models) must not hold
it on the accelerator, whose memory would then grow with the number of clients: every tensor
here lives on the CPU and is copied to the device only for the client that trains.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from fl_lightning.server.client_store import cpu_copy  # noqa: F401  (re-exported: FedSoft and LocalOnly import it here)
from fl_lightning.server.model_state import State


def optimizer_state_to_cpu(optimizer: torch.optim.Optimizer) -> dict[int, dict[str, Any]]:
    """The per-parameter state of ``optimizer`` (e.g. Adam's moments and step), copied to the CPU."""
    return {
        index: {key: v.detach().to("cpu", copy=True) if isinstance(v, Tensor) else v for key, v in entry.items()}
        for index, entry in optimizer.state_dict()["state"].items()
    }


def load_optimizer_state(optimizer: torch.optim.Optimizer, state: dict[int, dict[str, Any]] | None) -> None:
    """Installs a state saved by :func:`optimizer_state_to_cpu` (``None``: a fresh optimizer),
    keeping the optimizer's current hyper-parameters (learning rate, betas...)."""
    if not state:
        optimizer.state.clear()
        return
    # torch moves each value to its parameter's device and dtype (Adam's ``step`` stays on the CPU).
    optimizer.load_state_dict({"state": state, "param_groups": optimizer.state_dict()["param_groups"]})


class ClientStates:
    """Clients' personalised models (and optionally optimizer states), in CPU memory.

    Attributes:
        models: client id -> its model (every ``state_dict`` tensor).
        optimizers: client id -> one saved state per optimizer of the module.
    """

    def __init__(self) -> None:
        self.models: dict[int, State] = {}
        self.optimizers: dict[int, list[dict[int, dict[str, Any]]]] = {}

    def nbytes(self) -> int:
        """Bytes held, models and optimizer states together."""
        total = sum(t.numel() * t.element_size() for m in self.models.values() for t in m.values())
        for states in self.optimizers.values():
            for state in states:
                for entry in state.values():
                    total += sum(v.numel() * v.element_size() for v in entry.values() if isinstance(v, Tensor))
        return total

    def state_dict(self) -> dict[str, Any]:
        return {
            "models": {cid: dict(m) for cid, m in self.models.items()},
            "optimizers": {cid: list(s) for cid, s in self.optimizers.items()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.models = {int(cid): {k: v.cpu() for k, v in m.items()} for cid, m in state["models"].items()}
        self.optimizers = {int(cid): list(s) for cid, s in state["optimizers"].items()}
