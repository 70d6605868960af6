"""``compile_batched_steps``: the batched executor's steps under ``torch.compile`` give the eager steps'
weights, and a group compiles once (its steps all take one shape)."""

from __future__ import annotations

import shutil
from typing import Any

import pytest
import torch
from torch._dynamo.utils import counters

from fl_lightning.models import MLP

from ..quiet import quiet_trainer
from .test_batched_clients import fit, max_diff

#: Compiled against eager weights after 2 rounds: float32 rounding, since compiled steps always run
#: the padded per-sample path and inductor may fuse and reorder sums (measured: 1.5e-8, 3e-8).
TOL = 1e-6


def mlp() -> MLP:
    return MLP(in_features=12, hidden=(16,), num_classes=4, lr=0.1, momentum=0.9, weight_decay=1e-3)


@pytest.mark.parametrize(
    "backend",
    [
        "aot_eager",  # dynamo + AOTAutograd, no code generation: the executor's shapes and masks, in seconds
        pytest.param(
            "inductor",
            marks=pytest.mark.skipif(shutil.which("gcc") is None, reason="inductor needs a C++ compiler on the CPU"),
        ),
    ],
)
def test_compiled_steps_equal_eager_and_compile_once_per_group(backend: str) -> None:
    """Ragged clients (unequal steps and last batches) in one group: one graph, then one more when
    ``batch_idx`` changes and becomes a symbolic integer; never one per shape or per step."""
    reference, ref_log, _ = fit("batched", mlp)
    torch._dynamo.reset()
    counters.clear()
    model, log, _ = fit("batched", mlp, compile_batched_steps=backend)
    assert len({u.num_steps for u in log.updates.values()}) > 1  # ragged: finished clients ran padding
    assert counters["stats"]["unique_graphs"] <= 2
    assert max_diff(model.state_dict(), reference.state_dict()) <= TOL
    for key, want in ref_log.updates.items():
        assert log.updates[key].metrics["train_loss"] == pytest.approx(want.metrics["train_loss"], abs=1e-6)


@pytest.mark.parametrize(
    ("value", "executor"), [("no_such_backend", "batched"), ("inductor", "lean"), (True, "auto"), (1, "batched")]
)
def test_bad_compile_batched_steps(value: Any, executor: str) -> None:
    match = rf"`compile_batched_steps` must be True, False or a torch.compile backend .*got {value!r}"
    with pytest.raises(ValueError, match=match):
        quiet_trainer(client_executor=executor, compile_batched_steps=value)
