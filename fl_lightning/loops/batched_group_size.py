"""How many clients the batched executor trains at once when ``max_batched_clients`` is not given.

The rule (:func:`group_size`), for a module of ``M`` bytes of tensors whose ``training_step`` forward produces
``A`` bytes of outputs per client (:class:`~fl_lightning.loops.batched_activations.ForwardBytes`, measured on the
fit's first client, trained as a group of one):

- **memory**: each client of a group costs ``PER_CLIENT_COPIES`` copies of the module's tensors (its stacked
  weights, their gradients, the optimizer's state; ``benchmarks/memory.py`` measured 2-3 copies per client for an
  MLP with batches of 10) plus its activations ``A``, and a group may take ``MEMORY_SHARE`` of the device's free
  memory (:func:`free_memory`): ``K <= MEMORY_SHARE * free / (PER_CLIENT_COPIES * M + A)``;
- **speed, on a CPU**: a group whose activations outgrow the caches runs slower per client than a smaller one
  (the tiny GPT-2 LoRA, 128 clients a round, ``A`` = 15.7 MB: 10.8 clients/s in one group of 128 against 13-20
  at groups of 8-64, ``benchmarks/results/llm_lora.md``), so ``K <= CPU_GROUP_ACTIVATIONS / A``.

``K`` is at least 1 and at most the round's clients.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch
from torch import Tensor

#: Copies of the module's tensors one client of a group costs (weights, gradients, momentum).
PER_CLIENT_COPIES = 4
MEMINFO = Path("/proc/meminfo")
#: The share of the device's free memory a group may take (the rest: the global state, the updates, the allocator).
MEMORY_SHARE = 0.5
#: The forward outputs a group produces per step on a CPU, at most (measured: the knee of the LoRA sweep above).
CPU_GROUP_ACTIVATIONS = 512 * 2**20


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


def group_size(
    tensors: Iterable[Tensor], free_bytes: int | None, clients: int, *, forward_bytes: int = 0, on_cpu: bool = False
) -> int:
    """The rule of the module docstring for a module of ``tensors`` (each counted once), ``forward_bytes`` of forward
    outputs per client (0: not measured) and ``clients`` clients; all of them when nothing bounds the group."""
    unique = {id(t): t for t in tensors}.values()
    per_client = PER_CLIENT_COPIES * sum(t.numel() * t.element_size() for t in unique) + forward_bytes
    size = max(clients, 1)
    if free_bytes is not None and per_client:
        size = min(size, int(MEMORY_SHARE * free_bytes // per_client))
    if on_cpu and forward_bytes:
        size = min(size, CPU_GROUP_ACTIVATIONS // forward_bytes)
    return max(size, 1)
