"""The generic guard against a bypassed mixin: each term mixin counts the steps that applied its set term, the
executors refuse a client that trained without applying it, and the batched executor applies a set term too."""

from __future__ import annotations

import pytest
import torch

from fl_lightning import FedAvg, FederatedTrainer, FedSoft, LinearTermMixin, ProximalMixin
from fl_lightning.callbacks.federated_callback import FederatedCallback
from fl_lightning.mixins.applied_term import check_terms_applied, step_past_unset_terms
from fl_lightning.models import LinearRegression

from ..algorithms.quadratic import Quadratic, quadratic_data, quadratic_trainer
from ..algorithms.test_fedsoft import mixture_data
from ..integration.conftest import QUIET
from .nets import Net, batch


class Terms(LinearTermMixin, ProximalMixin, Net):
    pass


def _weights(module: torch.nn.Module, value: float) -> dict[str, torch.Tensor]:
    return {name: torch.full_like(p, value) for name, p in module.named_parameters()}


def test_counts_each_set_term_from_when_it_was_set():
    net = Terms()
    net.set_proximal_center(_weights(net, 1.0), 0.5)
    net.training_step(batch(), 0)
    net.set_linear_term(_weights(net, 0.1))
    net.training_step(batch(), 1)
    assert net.applied_term_steps == {ProximalMixin: 2, LinearTermMixin: 1}
    net.set_proximal_center(_weights(net, 1.0), 0.0)  # mu = 0 removes the term
    net.set_linear_term(None)
    assert net.applied_term_steps == {}
    assert Terms().applied_term_steps == {}  # per instance: nothing leaks through the class


def test_a_client_that_took_no_step_or_set_no_term_is_not_refused():
    net = Terms()
    check_terms_applied(net, 5, FedAvg())  # no term set
    net.set_proximal_center(_weights(net, 1.0), 0.5)
    check_terms_applied(net, 0, FedAvg())  # no step
    with pytest.raises(TypeError, match=r"Terms.training_step bypasses ProximalMixin.training_step, so FedAvg's term"):
        check_terms_applied(net, 1, FedAvg())


class BypassingRegression(LinearRegression):
    def training_step(self, batch, batch_idx):  # overrides the mixins' without calling super()
        x, y = batch
        return torch.nn.functional.mse_loss(self(x), y)


def test_fedsoft_with_a_bypassing_module_is_refused_and_with_lam_zero_trains():
    def fit(lam: float) -> None:
        algorithm = FedSoft(num_clusters=2, clients_per_cluster=2, lam=lam)
        trainer = FederatedTrainer(**{**QUIET, "max_epochs": 1, "local_epochs": 1, "limit_val_batches": 0, "algorithm": algorithm})
        trainer.fit(BypassingRegression(lr=0.05, optimizer="sgd"), datamodule=mixture_data())

    fit(0.0)
    with pytest.raises(TypeError, match=r"BypassingRegression.training_step bypasses ProximalMixin.training_step, so FedSoft's"):
        fit(0.5)


class ProximalQuadratic(ProximalMixin, Quadratic):
    pass


class SetCentre(FederatedCallback):
    """A user's way to set a term on every client, from a callback."""

    def __init__(self, mu: float) -> None:
        self.mu = mu

    def on_client_start(self, trainer, pl_module, client) -> None:
        pl_module.set_proximal_center(_weights(pl_module, 10.0), self.mu)


def fit_with_centre(mu: float, client_executor: str) -> torch.Tensor:
    module = ProximalQuadratic(lr=0.1)
    trainer = quadratic_trainer(
        max_epochs=1, local_steps=3, algorithm=FedAvg(), client_executor=client_executor, callbacks=[SetCentre(mu)]
    )
    trainer.fit(module, datamodule=quadratic_data())
    return module.w.detach()


def test_the_batched_executor_applies_a_term_a_callback_sets_as_the_lean_executor_does():
    assert not torch.allclose(fit_with_centre(5.0, "lean"), fit_with_centre(0.0, "lean"))  # the term matters
    torch.testing.assert_close(fit_with_centre(5.0, "batched"), fit_with_centre(5.0, "lean"), rtol=0, atol=1e-12)
    assert torch.equal(fit_with_centre(0.0, "batched"), fit_with_centre(0.0, "lean"))  # mu = 0 sets no term: batched trains


class Overriding(ProximalMixin, Net):
    """A subclass's own training_step over a mixin's: not a term mixin's, so never skipped."""

    def training_step(self, batch, batch_idx):
        return super().training_step(batch, batch_idx) * 2


def test_the_lean_step_skips_only_term_mixins_whose_term_is_unset():
    net = Terms()
    assert step_past_unset_terms(net).__func__ is Net.training_step  # no term set: both mixins add nothing
    net.set_linear_term(_weights(net, 0.1))
    assert step_past_unset_terms(net).__func__ is LinearTermMixin.training_step
    net.set_linear_term(None)
    net.set_proximal_center(_weights(net, 1.0), 0.5)
    step = step_past_unset_terms(net)
    assert step.__func__ is ProximalMixin.training_step and step.__self__ is net
    torch.testing.assert_close(step(batch(), 0), net.training_step(batch(), 0), rtol=0, atol=0)
    assert step_past_unset_terms(Overriding()).__func__ is Overriding.training_step
    on_instance = Terms()
    on_instance.training_step = lambda batch, batch_idx: torch.tensor(0.0)
    assert step_past_unset_terms(on_instance) is on_instance.training_step
    plain = Net()
    assert step_past_unset_terms(plain).__func__ is Net.training_step
