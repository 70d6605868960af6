"""The float32 master copy, in-place loading, deltas, sizes and finiteness checks."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import pytest
import torch
from torch import nn

import fl_lightning
from fl_lightning.server.model_state import all_finite, compute_delta, live_tensors, load_into, snapshot, tensor_bytes


def _net(dtype: torch.dtype = torch.float32) -> nn.Module:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3)).to(dtype)
    net.train()
    net(torch.randn(8, 4, dtype=dtype))  # moves the running stats and num_batches_tracked
    return net


def test_live_tensors_are_the_module_tensors() -> None:
    net = _net()
    live = live_tensors(net)
    assert set(live) == set(net.state_dict())
    assert live["0.weight"] is net[0].weight
    assert live["1.running_mean"] is net[1].running_mean
    assert live["1.num_batches_tracked"] is net[1].num_batches_tracked


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_snapshot_is_a_detached_float32_master_copy(dtype: torch.dtype) -> None:
    net = _net(dtype)
    live = live_tensors(net)
    snap = snapshot(live)
    for name, t in live.items():
        copy = snap[name]
        if t.is_floating_point():
            assert copy.dtype == torch.float32, name
            assert torch.equal(copy, t.detach().float()), name
        else:
            assert copy.dtype == t.dtype == torch.int64, name
            assert torch.equal(copy, t), name
        assert not copy.requires_grad, name
        assert copy.data_ptr() != t.data_ptr(), name
    snap["0.weight"].add_(1.0)
    snap["1.num_batches_tracked"].add_(5)
    assert not torch.equal(snap["0.weight"], net[0].weight.detach().float())
    assert net[1].num_batches_tracked.item() == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_load_into_is_in_place(dtype: torch.dtype) -> None:
    net = _net(dtype)
    live = live_tensors(net)
    params = {name: (p, p.data_ptr()) for name, p in net.named_parameters()}
    buffers = {name: (b, b.data_ptr()) for name, b in net.named_buffers()}
    state = {name: (t.float() + 0.5 if t.is_floating_point() else t + 3) for name, t in snapshot(live).items()}

    load_into(live, state)

    for name, (p, ptr) in params.items():
        current = dict(net.named_parameters())[name]
        assert current is p and current.data_ptr() == ptr, name
        assert current.dtype == dtype and current.requires_grad, name
        assert torch.equal(current.detach(), state[name].to(dtype)), name
    for name, (b, ptr) in buffers.items():
        current = dict(net.named_buffers())[name]
        assert current is b and current.data_ptr() == ptr, name
        assert torch.equal(current, state[name].to(current.dtype)), name
    assert net[1].num_batches_tracked.item() == 4


def test_load_into_keeps_optimizer_references_valid() -> None:
    net = _net()
    opt = torch.optim.SGD(net.parameters(), lr=1.0)
    live = live_tensors(net)
    zeros = {name: torch.zeros_like(t) for name, t in live.items()}
    load_into(live, zeros)
    net[0].weight.grad = torch.ones_like(net[0].weight)
    opt.step()
    assert torch.equal(net[0].weight.detach(), -torch.ones(3, 4))


def test_compute_delta() -> None:
    net = _net(torch.bfloat16)
    live = live_tensors(net)
    reference = snapshot(live)
    with torch.no_grad():
        net[0].weight.add_(2.0)
        net[1].num_batches_tracked.add_(4)
    delta = compute_delta(live, reference)
    assert delta["0.weight"].dtype == torch.float32
    torch.testing.assert_close(delta["0.weight"], net[0].weight.detach().float() - reference["0.weight"])
    assert torch.allclose(delta["0.weight"], torch.full((3, 4), 2.0), atol=2e-2)  # bf16 rounding of w + 2
    assert torch.equal(delta["0.bias"], torch.zeros(3))
    assert delta["1.num_batches_tracked"].dtype == torch.int64 and delta["1.num_batches_tracked"].item() == 4
    assert not delta["0.weight"].requires_grad


def test_no_tensors_is_no_work() -> None:
    # The _foreach calls behind load_into and compute_delta refuse empty lists; an empty state is still valid.
    load_into({}, {})
    assert compute_delta({}, {}) == {}


def test_tensor_bytes() -> None:
    tensors = {
        "f32": torch.zeros(3, 5),  # 60
        "bf16": torch.zeros(7, dtype=torch.bfloat16),  # 14
        "i64": torch.tensor(1),  # 8
        "u8": torch.zeros(2, 2, dtype=torch.uint8),  # 4
        "empty": torch.zeros(0),
    }
    assert tensor_bytes(tensors) == 86
    assert tensor_bytes({}) == 0
    net = nn.Linear(10, 4)
    assert tensor_bytes(live_tensors(net)) == (10 * 4 + 4) * 4


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_all_finite_detects_nan_and_inf(bad: float, dtype: torch.dtype) -> None:
    tensors = {"a": torch.ones(4, dtype=dtype), "b": torch.zeros(2, 3), "n": torch.tensor(3), "p": nn.Parameter(torch.ones(2))}
    assert all_finite(tensors)
    tensors["b"][1, 2] = bad
    assert not all_finite(tensors)
    tensors["b"][1, 2] = 0.0
    tensors["a"][0] = bad
    assert not all_finite(tensors)


def test_all_finite_ignores_integer_tensors() -> None:
    assert all_finite({})
    assert all_finite({"n": torch.tensor(torch.iinfo(torch.int64).max)})
    assert all_finite({"f": torch.tensor([1e38, -1e38])})


def test_float64_module_keeps_a_float64_master_copy() -> None:
    module = torch.nn.Linear(3, 2).double()
    live = live_tensors(module)
    master = snapshot(live)
    assert all(t.dtype == torch.float64 for t in master.values())
    with torch.no_grad():
        module.weight.fill_(0.1)
    delta = compute_delta(live, master)
    assert delta["weight"].dtype == torch.float64
    load_into(live, snapshot(live))
    assert module.weight[0, 0].item() == 0.1  # no round trip through float32


def test_state_is_defined_once_in_the_package():
    package = Path(fl_lightning.__file__).parent
    definitions = [
        str(path.relative_to(package))
        for path in package.rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "State" for t in node.targets)
    ]
    assert definitions == ["server/model_state.py"]
