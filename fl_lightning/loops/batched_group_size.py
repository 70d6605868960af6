"""How many clients the batched executor trains at once when ``max_batched_clients`` is not given.

The rule (:func:`group_size`): each client of a group costs about ``PER_CLIENT_COPIES`` copies of
the module's tensors (its stacked weights, their gradients, the momentum buffer, and as much
again for the step's activations and temporaries: ``benchmarks/memory.py`` measured 2-3 copies
per client for an MLP with batches of 10), and a group may take ``MEMORY_SHARE`` of the
device's free memory (:func:`free_memory`); so ``K = floor(MEMORY_SHARE * free / (PER_CLIENT_COPIES
* model bytes))``, at least 1 and at most the round's clients. Activations grow with the batch
and the layers' widths: for large batches of a small model, set ``max_batched_clients``.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch
from torch import Tensor

#: Copies of the module's tensors one client of a group costs (weights, gradients, momentum, activations).
PER_CLIENT_COPIES = 4
MEMINFO = Path("/proc/meminfo")
#: The share of the device's free memory a group may take (the rest: the global state, the updates, the allocator).
MEMORY_SHARE = 0.5


def free_memory(device: torch.device) -> int | None:
    """Bytes free on ``device``: CUDA's free memory plus what torch's allocator holds unused; on the
    CPU, Linux's ``MemAvailable`` (free memory plus the page cache it can drop); ``None`` where it
    cannot be read."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device))
    if device.type == "cpu" and MEMINFO.exists():
        for line in MEMINFO.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024  # reported in kB
    return None


def group_size(tensors: Iterable[Tensor], free_bytes: int | None, clients: int) -> int:
    """The rule of the module docstring for a module of ``tensors`` (each counted once) and ``clients``
    clients; all of them when the free memory is unknown."""
    unique = {id(t): t for t in tensors}.values()
    model_bytes = sum(t.numel() * t.element_size() for t in unique)
    if free_bytes is None or model_bytes == 0:
        return max(clients, 1)
    return max(1, min(clients, int(MEMORY_SHARE * free_bytes // (PER_CLIENT_COPIES * model_bytes))))
