"""The batched executor's default group size: half the free memory over four model copies and the activations per
client, and on a CPU a bound on the group's activations, measured on the fit's first client."""

from __future__ import annotations

import pytest
import torch

from fl_lightning.loops import batched_executor, batched_group_size
from fl_lightning.loops.batched_activations import ForwardBytes
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
    # Activations count in memory: 0.5 * 120 MiB / (12 MiB + 3 MiB) = 4 clients.
    assert group_size(weights, 120 * MIB, clients=50, forward_bytes=3 * MIB) == 4
    # On a CPU the group's activations are bounded too: 512 MiB / 100 MiB = 5 clients, whatever the free memory.
    assert group_size(weights, 10**15, clients=50, forward_bytes=100 * MIB, on_cpu=True) == 5
    assert group_size(weights, 10**15, clients=50, forward_bytes=100 * MIB) == 50
    assert group_size(weights, None, clients=50, forward_bytes=10**12, on_cpu=True) == 1


def test_free_memory_of_the_cpu_is_read() -> None:
    free = free_memory(torch.device("cpu"))
    assert free is None or free > 0
    assert free_memory(torch.device("meta")) is None


def model() -> MLP:
    return MLP(in_features=12, hidden=(16,), num_classes=4, lr=0.1)


def groups(log: object) -> list[int]:
    """The sizes of the groups a round's start/end events show (a group's members all start before any ends)."""
    sizes, started = [], 0
    for kind, _, _ in log.events:  # type: ignore[attr-defined]
        if kind == "start":
            started += 1
        elif started:
            sizes.append(started)
            started = 0
    return sizes


def test_the_executor_groups_by_the_rule_when_no_cap_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fit's first client trains alone and measures its forward outputs; then free memory for two clients of this
    MLP (four copies and the activations each) makes the round's other 3 clients train as 2 + 1, the next round's 4 as
    2 + 2, with the weights of one group."""
    measured: list[ForwardBytes] = []

    class Recording(ForwardBytes):
        def __enter__(self) -> ForwardBytes:
            measured.append(self)
            return super().__enter__()

    monkeypatch.setattr(batched_executor, "ForwardBytes", Recording)
    whole, whole_log, _ = fit("batched", model, max_epochs=2)
    assert len(measured) == 1 and measured[0].bytes > 0  # the first step only
    assert groups(whole_log) == [1, 3, 4]
    state = model().state_dict()
    per_client = PER_CLIENT_COPIES * sum(t.numel() * t.element_size() for t in state.values()) + measured[0].bytes
    monkeypatch.setattr(batched_executor, "free_memory", lambda device: 2 * per_client / MEMORY_SHARE)
    grouped, grouped_log, _ = fit("batched", model, max_epochs=2)
    assert groups(grouped_log) == [1, 2, 1, 2, 2]
    assert max_diff(grouped.state_dict(), whole.state_dict()) <= 1e-6


def test_on_a_cpu_the_groups_activations_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """With room for the activations of 3 clients per group: after the first client alone, the round's other 3 train
    as one group, the next round's 4 as two groups of equal size (2 + 2, not 3 + 1)."""
    sizes: list[int] = []

    class Recording(ForwardBytes):
        def __exit__(self, *exc: object) -> None:
            super().__exit__(*exc)
            sizes.append(self.bytes)

    monkeypatch.setattr(batched_executor, "ForwardBytes", Recording)
    fit("batched", model, max_epochs=1)
    monkeypatch.setattr(batched_group_size, "CPU_GROUP_ACTIVATIONS", 3 * sizes[0])
    _, log, _ = fit("batched", model, max_epochs=2)
    assert groups(log) == [1, 3, 2, 2]


def test_a_given_cap_or_compiled_steps_measure_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """``max_batched_clients`` cuts every group from the first; no step is measured."""
    monkeypatch.setattr(batched_executor, "ForwardBytes", None)  # would fail if entered
    _, log, _ = fit("batched", model, max_epochs=1, max_batched_clients=3)
    assert groups(log) == [3, 1]
