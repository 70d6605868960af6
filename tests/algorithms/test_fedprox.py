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


class Bypassing(ProximalMixin, Quadratic):
    training_step = Quadratic.training_step  # defined in the class that lists the mixin: the mixin never runs


class CallsSuper(ProximalMixin, Quadratic):
    def training_step(self, batch, batch_idx):
        return super().training_step(batch, batch_idx)  # through the mixin's, which adds the term


def fit(algorithm, module, **kwargs):
    trainer = quadratic_trainer(max_epochs=ROUNDS, algorithm=algorithm, local_steps=STEPS, **kwargs)
    trainer.fit(module, datamodule=quadratic_data())
    return module.w.detach()


@pytest.mark.parametrize("mu", [0.5, 2.0])
def test_matches_plain_proximal_gradient_descent(mu):
    assert torch.allclose(fit(FedProx(mu=mu), ProximalQuadratic(lr=LR)), reference(mu), atol=1e-12, rtol=0)
    assert not torch.allclose(reference(mu), reference(0.0))  # the term changes the result


def test_a_training_step_calling_super_through_the_mixin_matches_the_reference():
    assert torch.allclose(fit(FedProx(mu=0.5), CallsSuper(lr=LR)), reference(0.5), atol=1e-12, rtol=0)


@pytest.mark.parametrize("executor", ["lightning", "lean"])
def test_a_training_step_that_bypasses_the_mixin_is_refused_after_the_first_client(executor):
    module = Bypassing(lr=LR)
    with pytest.raises(
        TypeError,
        match=r"^Bypassing.training_step bypasses ProximalMixin.training_step, so FedProx's term was never applied in 3 "
        r"training step\(s\): .* class Fixed\(ProximalMixin, Bypassing\), or call super\(\).training_step\(\) from it.$",
    ):
        fit(FedProx(mu=0.5), module, client_executor=executor)
    assert module.forward_calls == STEPS  # round 0's first client only


def test_mu_zero_sets_no_term_so_a_bypassing_module_trains_as_fedavg():
    assert torch.equal(fit(FedProx(mu=0.0), Bypassing(lr=LR)), fit(FedAvg(), Quadratic(lr=LR)))


def test_mu_zero_is_fedavg_bit_for_bit():
    assert torch.equal(fit(FedProx(mu=0.0), ProximalQuadratic(lr=LR)), fit(FedAvg(), Quadratic(lr=LR)))


def test_setup_without_the_mixin_names_the_fix():
    with pytest.raises(TypeError, match=r"FedProx needs a LightningModule that inherits `fl_lightning.ProximalMixin`"):
        fit(FedProx(mu=0.1), Quadratic(lr=LR))
