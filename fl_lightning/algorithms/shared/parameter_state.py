"""Server-side state shaped like the trainable parameters: SCAFFOLD's control variates, FedDyn's h."""

from __future__ import annotations

import torch

from fl_lightning.server.client_store import cpu_copy
from fl_lightning.server.federation import Federation
from fl_lightning.server.model_state import State


def zero_parameter_state(federation: Federation) -> State:
    """Zeros shaped like the module's trainable parameters (buffers left out), on the CPU in at least float32."""
    weights = cpu_copy(federation.local_weights())
    return {name: torch.zeros_like(t) for name, t in weights.items() if name in federation.param_names}


def state_norm(state: State) -> float:
    """The Euclidean norm of all of ``state``'s tensors together, accumulated in float64."""
    return float(torch.sqrt(sum((t.double() ** 2).sum() for t in state.values())))
