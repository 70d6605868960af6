"""The batched executor's default group size: half the free memory over four model copies per client."""

from __future__ import annotations

import pytest
import torch

from fl_lightning.loops import batched_executor
from fl_lightning.loops.batched_group_size import MEMORY_SHARE, PER_CLIENT_COPIES, free_memory, group_size
from fl_lightning.models import MLP

from .test_batched_clients import fit, max_diff

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


def test_the_executor_groups_by_the_rule_when_no_cap_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    """Free memory for two clients of this MLP: the round's 4 clients train as 2 + 2, with the weights of one group."""
    state = MLP(in_features=12, hidden=(16,), num_classes=4).state_dict()
    model_bytes = sum(t.numel() * t.element_size() for t in state.values())
    monkeypatch.setattr(batched_executor, "free_memory", lambda device: 2 * PER_CLIENT_COPIES * model_bytes / MEMORY_SHARE)
    grouped, grouped_log, _ = fit("batched", lambda: MLP(in_features=12, hidden=(16,), num_classes=4, lr=0.1), max_epochs=1)
    assert [kind for kind, _, _ in grouped_log.events] == ["start", "start", "end", "end"] * 2
    monkeypatch.undo()
    whole, whole_log, _ = fit("batched", lambda: MLP(in_features=12, hidden=(16,), num_classes=4, lr=0.1), max_epochs=1)
    assert [kind for kind, _, _ in whole_log.events] == ["start"] * 4 + ["end"] * 4
    assert max_diff(grouped.state_dict(), whole.state_dict()) <= 1e-6
