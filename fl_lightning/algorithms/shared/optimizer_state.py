"""A client's optimizer state on the CPU, and as a flat entry of a :class:`~fl_lightning.server.client_store.ClientStore`.

Algorithms that carry a client's optimizer state across its rounds (FedSoft with ``persist_optimizer_state``, as
its authors carry Adam's moments) keep it on the CPU, copied to the device only for the client that trains,
and store it flattened to name -> tensor (:func:`flatten_optimizer_states`) like any other per-client state.
"""

from __future__ import annotations

import torch
from torch import Tensor

from fl_lightning.server.model_state import State
from fl_lightning.server.services import OptimizerState

#: The marker of a Python number in a flattened state, by type (restored with ``.item()``).
_NUMBER_TYPES: dict[str, type] = {"int": int, "float": float, "bool": bool}
_COUNT = "num_optimizers"


def optimizer_state_to_cpu(optimizer: torch.optim.Optimizer) -> OptimizerState:
    """The per-parameter state of ``optimizer`` (e.g. Adam's moments and step), copied to the CPU."""
    return {
        index: {key: v.detach().to("cpu", copy=True) if isinstance(v, Tensor) else v for key, v in entry.items()}
        for index, entry in optimizer.state_dict()["state"].items()
    }


def load_optimizer_state(optimizer: torch.optim.Optimizer, state: OptimizerState | None) -> None:
    """Installs a state saved by :func:`optimizer_state_to_cpu` (``None``: a fresh optimizer),
    keeping the optimizer's current hyper-parameters (learning rate, betas...)."""
    if not state:
        optimizer.state.clear()
        return
    # torch moves each value to its parameter's device and dtype (Adam's ``step`` stays on the CPU).
    optimizer.load_state_dict({"state": state, "param_groups": optimizer.state_dict()["param_groups"]})


def flatten_optimizer_states(states: list[OptimizerState]) -> State:
    """The states of a module's optimizers as one flat entry, ``"{optimizer}.{parameter}.{key}"`` -> tensor
    (a Python number becomes a 0-d tensor under ``"...{key}#{type}"``; ``None`` values are left out, as
    torch's optimizers read a missing key as ``None``)."""
    flat: State = {_COUNT: torch.tensor(len(states))}
    for i, state in enumerate(states):
        for index, entry in state.items():
            for key, value in entry.items():
                name = f"{i}.{index}.{key}"
                if isinstance(value, Tensor):
                    flat[name] = value
                elif isinstance(value, (bool, int, float)):
                    flat[f"{name}#{type(value).__name__}"] = torch.tensor(value)
                elif value is not None:
                    raise TypeError(
                        f"Optimizer state `{key}` of parameter {index} is a {type(value).__name__}: only tensors and "
                        "numbers can be stored per client."
                    )
    return flat


def unflatten_optimizer_states(flat: State) -> list[OptimizerState]:
    """The inverse of :func:`flatten_optimizer_states`."""
    states: list[OptimizerState] = [{} for _ in range(int(flat[_COUNT]))]
    for name, value in flat.items():
        if name == _COUNT:
            continue
        i, index, key = name.split(".", 2)
        key, _, number = key.partition("#")
        states[int(i)].setdefault(int(index), {})[key] = _NUMBER_TYPES[number](value.item()) if number else value
    return states
