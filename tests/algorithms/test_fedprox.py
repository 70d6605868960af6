"""FedProx through FederatedTrainer against plain-PyTorch proximal gradient descent on quadratic devices."""

from __future__ import annotations

import pytest
import torch

from fl_lightning import FedAvg, FedProx, ProximalMixin

from .quadratic import CENTRES, Quadratic, quadratic_data, quadratic_trainer

LR, STEPS, ROUNDS = 0.1, 3, 3


class ProximalQuadratic(ProximalMixin, Quadratic):
    pass


def reference(mu: float) -> torch.Tensor:
    """Every round all 4 devices run STEPS full-batch GD steps on ||w - c_k||^2/2 + mu/2 ||w - w^t||^2
    (Li et al. 2020, eq. 2) from w^t; the server takes the sample-weighted (here equal) mean."""
    w = torch.zeros(2, dtype=torch.float64)
    for _ in range(ROUNDS):
        locals_ = []
        for centre in CENTRES:
            v = w.clone()
            for _ in range(STEPS):
                v = v - LR * ((v - centre) + mu * (v - w))
            locals_.append(v)
        w = torch.stack(locals_).mean(dim=0)
    return w


def fit(algorithm, module):
    quadratic_trainer(max_epochs=ROUNDS, algorithm=algorithm, local_steps=STEPS).fit(module, datamodule=quadratic_data())
    return module.w.detach()


@pytest.mark.parametrize("mu", [0.5, 2.0])
def test_matches_plain_proximal_gradient_descent(mu):
    assert torch.allclose(fit(FedProx(mu=mu), ProximalQuadratic(lr=LR)), reference(mu), atol=1e-12, rtol=0)
    assert not torch.allclose(reference(mu), reference(0.0))  # the term changes the result


def test_mu_zero_is_fedavg_bit_for_bit():
    assert torch.equal(fit(FedProx(mu=0.0), ProximalQuadratic(lr=LR)), fit(FedAvg(), Quadratic(lr=LR)))


def test_setup_without_the_mixin_names_the_fix():
    with pytest.raises(TypeError, match=r"FedProx needs a LightningModule that inherits `fl_lightning.ProximalMixin`"):
        fit(FedProx(mu=0.1), Quadratic(lr=LR))
