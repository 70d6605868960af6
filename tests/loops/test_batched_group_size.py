"""The batched executor's default group size: half the free memory over four model copies per client."""

from __future__ import annotations

import torch

from fl_lightning.loops.batched_group_size import free_memory, group_size

MIB = 2**20


def test_group_size_rule() -> None:
    weights = [torch.zeros(MIB // 4), torch.zeros(MIB // 4, dtype=torch.float64)]  # 1 MiB + 2 MiB
    # 0.5 * 120 MiB / (4 * 3 MiB) = 5 clients per group.
    assert group_size(weights, 120 * MIB, clients=50) == 5
    assert group_size(weights, 119 * MIB, clients=50) == 4
    assert group_size(weights, 10**15, clients=50) == 50  # never more than the round's clients
    assert group_size(weights, 1 * MIB, clients=50) == 1  # at least one
    assert group_size(weights, None, clients=50) == 50  # unknown free memory: one group
    tied = weights[0]
    assert group_size([tied, tied, weights[1]], 120 * MIB, clients=50) == 5  # a tied tensor counts once


def test_free_memory_of_the_cpu_is_read() -> None:
    free = free_memory(torch.device("cpu"))
    assert free is None or free > 0
    assert free_memory(torch.device("meta")) is None
