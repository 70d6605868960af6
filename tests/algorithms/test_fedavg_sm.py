"""FedAvg w. SM (FedMRN §5.4): FedAvg's local update, stochastically masked over G(s) after training.

Oracle: one client per round, so FedAvg's global step is that client's update :math:`u`; FedAvgSM
from the same start must land on :math:`w^0 + G(s) \\odot \\mathcal{M}(u, G(s))` (eq. 5-8) with
FedMRN's seeds, the mask drawn in layer order from one generator.
"""

from __future__ import annotations

import pytest
import torch

from fl_lightning import FedAvg, FedAvgSM
from fl_lightning.compression.masked_noise_codec import generate_noise
from fl_lightning.utils.seeding import derive_seed, make_generator

from .fedmrn_fixtures import Tiny, digits, trainer

SEED = 5
NAMES = ("net.0.weight", "net.2.weight")


def fit_one_round(algorithm) -> Tiny:
    torch.manual_seed(0)
    model = Tiny()  # a plain model: post-training masking needs no mixin
    trainer(max_epochs=1, clients_per_round=1, local_epochs=1, seed=SEED, algorithm=algorithm).fit(model, datamodule=digits())
    return model


@pytest.mark.parametrize("mask", ["binary", "signed"])
def test_fedavg_sm_masks_fedavgs_final_update_over_seeded_noise(mask):
    torch.manual_seed(0)
    initial = Tiny()
    start = [initial.get_parameter(n).detach().clone() for n in NAMES]
    fedavg = fit_one_round(FedAvg())
    updates = [fedavg.get_parameter(n).detach() - w for n, w in zip(NAMES, start)]
    algorithm = FedAvgSM(mask=mask, alpha=0.05)
    masked = fit_one_round(algorithm)

    client = torch.randperm(digits().num_clients, generator=make_generator(SEED, "select", 0))[0].item()
    client_seed = derive_seed(SEED, "client", 0, client)
    noise = generate_noise(
        derive_seed(client_seed, "masked_noise", "noise"), [u.shape for u in updates], noise="uniform", alpha=0.05
    )
    draws = torch.Generator().manual_seed(derive_seed(client_seed, "masked_noise", "mask"))
    for name, w, u, n in zip(NAMES, start, updates, noise):
        ratio = (u / n).clamp(0, 1) if mask == "binary" else ((u / n + 1) / 2).clamp(0, 1)
        bits = torch.rand(u.shape, generator=draws) < ratio
        expected = w + torch.where(bits, n, torch.zeros_like(n) if mask == "binary" else -n)
        torch.testing.assert_close(masked.get_parameter(name).detach(), expected, rtol=0, atol=1e-6)
        # Every element moved by exactly one noise value (or 0 / -n): 1 bit per element reached the server.
        moved = (masked.get_parameter(name).detach() - w).abs()
        assert torch.allclose(moved[moved > 1e-7], n.abs()[moved > 1e-7], atol=1e-6)
    assert not torch.equal(updates[0], torch.zeros_like(updates[0]))



def test_fedavg_sm_uploads_the_seed_and_one_bit_per_masked_weight():
    algorithm = FedAvgSM()
    fit_one_round(algorithm)
    masked = sum(s.numel for s in algorithm.layout.compressed)
    # FedMRN's payload: 4-byte prefix, 14-byte header (mask, noise, seed, alpha), the packed bits.
    assert algorithm.codec.payload_size(algorithm.layout) == 4 + 14 + (16 * 64 + 7) // 8 + (10 * 16 + 7) // 8
    assert masked == 16 * 64 + 10 * 16
