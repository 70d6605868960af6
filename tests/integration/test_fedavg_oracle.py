"""Oracle: FedAvg through FederatedTrainer equals a plain-PyTorch implementation of the same rounds."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fl_lightning.models import CNN, MLP
from fl_lightning.utils.seeding import derive_seed, make_generator

SEED, ROUNDS, CLIENTS_PER_ROUND, LR = 7, 3, 4, 0.1


def plain_fedavg(net: nn.Module, data, *, rounds: int, local_epochs: int | None, local_steps: int | None) -> dict:
    """FedAvg (McMahan et al. 2017) written directly in PyTorch, with the library's documented
    conventions: clients drawn by ``randperm`` from the (seed, "select", round) generator, each
    client's batch order from its (seed, "client", round, cid) generator, sample-count weights,
    integer buffers advanced by the rounded weighted-mean increment."""
    device = next(net.parameters()).device
    global_state = {k: v.clone() for k, v in net.state_dict().items()}
    for r in range(rounds):
        order = torch.randperm(data.num_clients, generator=make_generator(SEED, "select", r))
        clients = sorted(order[:CLIENTS_PER_ROUND].tolist())
        deltas, weights = [], []
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
            for x, y in batches:
                x, y = x.to(device), y.to(device)
                opt.zero_grad()
                F.cross_entropy(net(x), y).backward()
                opt.step()
            deltas.append({k: v.float() - global_state[k].float() for k, v in net.state_dict().items()})
            weights.append(data.client_num_samples(cid))
        total = sum(weights)
        for k, v in global_state.items():
            avg = sum(w * d[k] for w, d in zip(weights, deltas)) / total
            global_state[k] = v + (avg if v.is_floating_point() else torch.round(avg).to(v.dtype))
    return global_state


@pytest.mark.parametrize(
    ("model_fn", "as_image", "local_epochs", "local_steps"),
    [
        (lambda: MLP(in_features=64, hidden=(32,), lr=LR), False, 1, None),
        (lambda: CNN(in_channels=1, image_size=8, batch_norm=True, lr=LR), True, None, 5),
    ],
    ids=["mlp-epochs", "cnn-batchnorm-steps"],
)
def test_fedavg_matches_plain_pytorch(make_data, make_trainer, model_fn, as_image, local_epochs, local_steps):
    torch.manual_seed(0)
    model = model_fn()
    reference_net = copy.deepcopy(model.net)
    data = make_data(as_image=as_image)

    trainer = make_trainer(
        max_epochs=ROUNDS, clients_per_round=CLIENTS_PER_ROUND, local_epochs=local_epochs, local_steps=local_steps, seed=SEED
    )
    trainer.fit(model, datamodule=data)

    expected = plain_fedavg(reference_net, data, rounds=ROUNDS, local_epochs=local_epochs, local_steps=local_steps)
    actual = model.net.state_dict()
    assert expected.keys() == actual.keys()
    for name, value in expected.items():
        diff = (actual[name].double() - value.double()).abs().max().item()
        assert diff <= 1e-6, f"{name}: max abs difference {diff}"
    if as_image:  # BatchNorm statistics moved and its counter advanced.
        assert actual["1.num_batches_tracked"].item() > 0
        assert not torch.equal(actual["1.running_mean"], torch.zeros_like(actual["1.running_mean"]))
