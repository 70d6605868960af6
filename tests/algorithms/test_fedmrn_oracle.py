"""Oracle: FedMRN through FederatedTrainer equals a plain-PyTorch FedMRN of the same rounds.

The reference implements eq. 5-10 directly on tensors (no mixin, no codec, no hooks), with the
library's documented conventions: the run's client selection and data order, per-client seeds
``derive_seed(client_seed, "masked_noise", "noise" | "psm" | "mask")``, uniform noise drawn in
layer order from one CPU generator (|n| < 1e-8 replaced by 1e-8), per step and per layer the mask
draw then the PM draw (skipped at p = 1), p = τ/S, SGD on u with the gradient of the effective
weight (STE), one final stochastic mask, and sample-weighted aggregation accumulated client by
client in float32.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fl_lightning import FedMRN
from fl_lightning.utils.seeding import derive_seed, make_generator

from .fedmrn_fixtures import digits, tiny, trainer

SEED, ROUNDS, CLIENTS, LR = 3, 2, 3, 0.1


def plain_fedmrn(weights: list[torch.Tensor], data, *, mask: str, alpha: float) -> list[torch.Tensor]:
    def prob(u, n):
        r = u / n
        return (r if mask == "binary" else (r + 1) / 2).clamp(0, 1)

    def value(bits, n):
        return torch.where(bits, n, torch.zeros_like(n) if mask == "binary" else -n)

    def clip(u, n):
        return n * ((u / n).clamp(0, 1) if mask == "binary" else (u / n).clamp(-1, 1))

    w = [t.clone() for t in weights]
    for r in range(ROUNDS):
        order = torch.randperm(data.num_clients, generator=make_generator(SEED, "select", r))
        deltas, sizes = [], []
        for cid in sorted(order[:CLIENTS].tolist()):
            cseed = derive_seed(SEED, "client", r, cid)
            g_noise = torch.Generator().manual_seed(derive_seed(cseed, "masked_noise", "noise"))
            noise = [(torch.rand(t.shape, generator=g_noise) * 2 - 1) * alpha for t in w]
            noise = [torch.where(n.abs() < 1e-8, torch.full_like(n, 1e-8), n) for n in noise]
            u = [torch.zeros_like(t) for t in w]
            batches = list(data.client_batches(cid, num_epochs=1, generator=torch.Generator().manual_seed(cseed)))
            g = torch.Generator().manual_seed(derive_seed(cseed, "masked_noise", "psm"))
            for tau, (x, y) in enumerate(batches, start=1):
                p = tau / len(batches)
                effective = []
                for wi, ui, ni in zip(w, u, noise):
                    v = value(torch.rand(ui.shape, generator=g) < prob(ui, ni), ni)
                    if p < 1:
                        v = torch.where(torch.rand(ui.shape, generator=g) < p, v, clip(ui, ni))
                    effective.append((wi + v).requires_grad_())
                F.cross_entropy(F.linear(F.relu(F.linear(x, effective[0])), effective[1]), y).backward()
                for ui, e in zip(u, effective):
                    ui.add_(e.grad, alpha=-LR)
            g_mask = torch.Generator().manual_seed(derive_seed(cseed, "masked_noise", "mask"))
            deltas.append([value(torch.rand(ui.shape, generator=g_mask) < prob(ui, ni), ni) for ui, ni in zip(u, noise)])
            sizes.append(data.client_num_samples(cid))
        for i, wi in enumerate(w):
            acc = torch.zeros_like(wi)
            for d, n_k in zip(deltas, sizes):
                acc.add_(d[i], alpha=float(n_k))
            wi.add_(acc.div_(float(sum(sizes))))
    return w


@pytest.mark.parametrize("mask", ["binary", "signed"])
def test_fedmrn_matches_plain_pytorch(mask):
    model = tiny()
    start = [model.net[0].weight.detach().clone(), model.net[2].weight.detach().clone()]
    data = digits()
    algorithm = FedMRN(mask=mask)
    trainer(max_epochs=ROUNDS, clients_per_round=CLIENTS, local_epochs=1, seed=SEED, algorithm=algorithm).fit(
        model, datamodule=data
    )
    expected = plain_fedmrn(start, data, mask=mask, alpha=algorithm.codec.alpha)
    for name, value in zip(("net.0.weight", "net.2.weight"), expected):
        diff = (model.get_parameter(name).double() - value.double()).abs().max().item()
        assert diff <= 1e-6, f"{name}: max abs difference {diff}"
    assert not torch.equal(expected[0], start[0])
