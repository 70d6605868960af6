"""Oracle: FedAvg through FederatedTrainer equals a plain-PyTorch implementation of the same rounds."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fl_lightning.models import CNN, MLP
from fl_lightning.utils.seeding import derive_seed, make_generator

from ..tolerances import cross_path_tolerance

SEED, ROUNDS, CLIENTS_PER_ROUND, LR = 7, 3, 4, 0.1


def plain_fedavg(net: nn.Module, data, *, rounds: int, local_epochs: int | None, local_steps: int | None) -> tuple[dict, int]:
    """FedAvg (McMahan et al. 2017) written directly in PyTorch, with the library's documented
    conventions: clients drawn by ``randperm`` from the (seed, "select", round) generator, each
    client's batch order from its (seed, "client", round, cid) generator, sample-count weights,
    deltas in at least float32, integer buffers advanced by the rounded weighted-mean increment; inputs in the net's dtype.

    Returns the final state and the depth of the training: the sequential optimizer steps behind it
    (each round's longest client), for :func:`~tests.tolerances.cross_path_tolerance`."""
    device, dtype = next(net.parameters()).device, next(net.parameters()).dtype
    global_state = {k: v.clone() for k, v in net.state_dict().items()}
    depth = 0
    for r in range(rounds):
        order = torch.randperm(data.num_clients, generator=make_generator(SEED, "select", r))
        clients = sorted(order[:CLIENTS_PER_ROUND].tolist())
        deltas, weights, round_depth = [], [], 0
        for cid in clients:
            net.load_state_dict(global_state)
            net.train()
            opt = torch.optim.SGD(net.parameters(), lr=LR)
            batches = data.client_batches(
                cid,
                num_epochs=local_epochs,
                num_batches=local_steps,
                generator=torch.Generator().manual_seed(derive_seed(SEED, "client", r, cid)),
            )
            for steps, (x, y) in enumerate(batches, start=1):
                x, y = x.to(device, dtype), y.to(device)
                opt.zero_grad()
                F.cross_entropy(net(x), y).backward()
                opt.step()
            round_depth = max(round_depth, steps)
            deltas.append({k: _master(v) - _master(global_state[k]) for k, v in net.state_dict().items()})
            weights.append(data.client_num_samples(cid))
        total = sum(weights)
        for k, v in global_state.items():
            avg = sum(w * d[k] for w, d in zip(weights, deltas)) / total
            global_state[k] = v + (avg if v.is_floating_point() else torch.round(avg).to(v.dtype))
        depth += round_depth
    return global_state, depth


def _master(t: torch.Tensor) -> torch.Tensor:
    """The aggregation dtype the library documents: at least float32, float64 for integer counters."""
    return t.to(torch.promote_types(t.dtype, torch.float32) if t.is_floating_point() else torch.float64)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize(
    ("model_fn", "as_image", "local_epochs", "local_steps"),
    [
        (lambda: MLP(in_features=64, hidden=(32,), lr=LR), False, 1, None),
        (lambda: CNN(in_channels=1, image_size=8, batch_norm=True, lr=LR), True, None, 5),
    ],
    ids=["mlp-epochs", "cnn-batchnorm-steps"],
)
def test_fedavg_matches_plain_pytorch(make_data, make_trainer, model_fn, as_image, local_epochs, local_steps, dtype):
    """Equal up to rounding (:mod:`tests.tolerances`): float64 makes the claim tight on any CPU; float32 is the
    default path, whose rounding differences (fused multiply-adds, the CPU's kernels) grow with the steps."""
    torch.manual_seed(0)
    model = model_fn().to(dtype)
    reference_net = copy.deepcopy(model.net)
    data = make_data(as_image=as_image)

    trainer = make_trainer(
        max_epochs=ROUNDS, clients_per_round=CLIENTS_PER_ROUND, local_epochs=local_epochs, local_steps=local_steps,
        seed=SEED, precision="64-true" if dtype == torch.float64 else "32-true",
    )  # fmt: skip
    trainer.fit(model, datamodule=data)

    expected, depth = plain_fedavg(reference_net, data, rounds=ROUNDS, local_epochs=local_epochs, local_steps=local_steps)
    actual = model.net.state_dict()
    assert expected.keys() == actual.keys()
    tolerance = cross_path_tolerance(dtype, depth)
    for name, value in expected.items():
        assert actual[name].dtype == value.dtype, name
        diff = (actual[name].double() - value.double()).abs().max().item()
        assert diff <= tolerance, f"{name}: max abs difference {diff} > {tolerance:.1e} ({dtype}, {depth} steps)"
    if as_image:  # BatchNorm statistics moved and its counter advanced.
        assert actual["1.num_batches_tracked"].item() > 0
        assert not torch.equal(actual["1.running_mean"], torch.zeros_like(actual["1.running_mean"]))
