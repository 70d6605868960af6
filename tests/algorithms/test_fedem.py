"""FedEM (Marfoq et al. 2021) through the federated loop: a plain-PyTorch oracle of one round,
the M = 1 reduction to FedAvg, pi's rows, resume, and bad input."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from fl_lightning import FedAvg, FederatedTrainer, FedEM, MixtureWeightedMixin
from fl_lightning.cli import FederatedCLI
from fl_lightning.models import LinearRegression, MixtureLinearRegression

from ..integration.conftest import QUIET
from .quadratic import Quadratic, quadratic_data
from .test_fedsoft import N, mixture_data, oracle_centres

LR = 0.05


def fit(algorithm, *, rounds: int = 1, data=None, model_cls=MixtureLinearRegression, **kwargs):
    torch.manual_seed(0)
    model = model_cls(lr=LR, optimizer="sgd")
    settings = {**QUIET, "max_epochs": rounds, "local_epochs": 1, "limit_val_batches": 0, "algorithm": algorithm}
    trainer = FederatedTrainer(**{**settings, **kwargs})
    trainer.fit(model, datamodule=data if data is not None else mixture_data(holdout=0.0))
    return model, trainer


def sq_errors(w: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return ((x @ w.T - y) ** 2).mean(dim=-1)


@pytest.mark.parametrize("executor", ["lightning", "lean"])
def test_one_round_equals_a_plain_pytorch_fedem(executor):
    data = mixture_data(holdout=0.0)
    centres = oracle_centres(data)
    centres[1]["net.weight"] += 1.0  # not the truth, so that every q is strictly inside (0, 1)
    start = [c["net.weight"].clone() for c in centres]
    _, trainer = fit(FedEM(num_components=2, centres=centres), data=data, client_executor=executor)
    loop, algorithm = trainer.fit_loop, trainer.algorithm

    new_pi, deltas, sizes = [], [], []
    for t in range(N):
        x, y = (torch.cat(parts) for parts in zip(*loop.client_batches(loop.client_context(0, t)), strict=True))
        log_prior = torch.full((2,), 0.5).log()
        q = (log_prior - torch.stack([sq_errors(w, x, y) for w in start], dim=1)).softmax(dim=1)  # E-step
        new_pi.append(q.double().mean(dim=0))  # M-step for pi
        client = []
        for m, w0 in enumerate(start):  # M-step for each component: weighted local SGD
            w = w0.clone().requires_grad_()
            for xb, yb in loop.client_batches(loop.client_context(0, t)):
                with torch.no_grad():
                    qb = (log_prior - torch.stack([sq_errors(v, xb, yb) for v in start], dim=1)).softmax(dim=1)[:, m]
                (grad,) = torch.autograd.grad((qb * sq_errors(w, xb, yb)).mean(), w)
                w = (w - LR * grad).detach().requires_grad_()
            client.append(w.detach() - w0)
        deltas.append(client)
        sizes.append(len(y))
    weights = torch.tensor(sizes, dtype=torch.float32) / sum(sizes)
    for m, w0 in enumerate(start):
        expected = w0 + sum(wt * d[m] for wt, d in zip(weights, deltas, strict=True))
        torch.testing.assert_close(algorithm.centres[m]["net.weight"], expected, rtol=0, atol=1e-6)
    torch.testing.assert_close(algorithm.pi, torch.stack(new_pi), rtol=0, atol=1e-6)
    assert 0.0 < algorithm.pi.min() and algorithm.pi.max() < 1.0
    assert loop.history == [list(range(N))]
    assert trainer.callback_metrics["round/upload_bytes"] == N * 2 * 10 * 4  # M deltas of Linear(10 -> 1)


def test_pi_rows_sum_to_one_and_are_logged():
    _, trainer = fit(FedEM(num_components=3, evaluate_sources=True), rounds=2, clients_per_round=5)
    pi = trainer.algorithm.pi
    torch.testing.assert_close(pi.sum(dim=1), torch.ones(N, dtype=torch.float64), rtol=0, atol=1e-12)
    assert sum(float(trainer.callback_metrics[f"round/fedem_pi_mean_c{m}"]) for m in range(3)) == pytest.approx(1.0)
    assert 0.0 < float(trainer.callback_metrics["round/fedem_pi_entropy"]) <= torch.log(torch.tensor(3.0)) + 1e-6


def test_one_component_is_fedavg():
    # softmax over one component is exactly 1.0, so the weighted loss is the plain mean squared error
    # (same float ops for Linear(10 -> 1)) and FedEM's n_t-weighted average is FedAvg's: bit for bit.
    start = {"net.weight": torch.linspace(-1, 1, 10)[None, :]}
    fedem_model, _ = fit(FedEM(num_components=1, centres=[start]), rounds=2, clients_per_round=5)
    fedavg_model = LinearRegression(lr=LR, optimizer="sgd")
    fedavg_model.net.weight.data.copy_(start["net.weight"])
    settings = {**QUIET, "max_epochs": 2, "local_epochs": 1, "limit_val_batches": 0, "clients_per_round": 5}
    FederatedTrainer(**settings, algorithm=FedAvg()).fit(fedavg_model, datamodule=mixture_data(holdout=0.0))
    assert torch.equal(fedem_model.net.weight, fedavg_model.net.weight)


def test_resume_gives_identical_components_and_pi(tmp_path):
    checkpoint = ModelCheckpoint(dirpath=tmp_path, every_n_epochs=1, save_top_k=-1, filename="{epoch}")
    straight, trainer = fit(FedEM(), rounds=3, clients_per_round=4, callbacks=[checkpoint], enable_checkpointing=True)
    torch.manual_seed(0)
    resumed = MixtureLinearRegression(lr=LR, optimizer="sgd")
    settings = {**QUIET, "max_epochs": 3, "local_epochs": 1, "limit_val_batches": 0, "clients_per_round": 4}
    again = FederatedTrainer(**settings, algorithm=FedEM())
    again.fit(resumed, datamodule=mixture_data(holdout=0.0), ckpt_path=tmp_path / "epoch=0.ckpt")
    assert torch.equal(straight.net.weight, resumed.net.weight)
    assert torch.equal(trainer.algorithm.pi, again.algorithm.pi)
    for a, b in zip(trainer.algorithm.centres, again.algorithm.centres, strict=True):
        assert torch.equal(a["net.weight"], b["net.weight"])


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_bad_number_of_components(bad):
    with pytest.raises(ValueError, match=rf"number of components M \(`num_components`\) must be an int >= 1, got {bad!r}"):
        FedEM(num_components=bad)


def test_a_module_without_the_mixin_is_rejected():
    trainer = FederatedTrainer(**{**QUIET, "max_epochs": 1, "local_steps": 1, "algorithm": FedEM()})
    with pytest.raises(TypeError, match=r"inherits `fl_lightning.MixtureWeightedMixin`.*MixtureWeightedMixin, Quadratic\)"):
        trainer.fit(Quadratic(), datamodule=quadratic_data())


class BypassingMixture(MixtureWeightedMixin, LinearRegression):
    training_step = LinearRegression.training_step  # defined in the class that lists the mixin: the mixin never runs


def test_a_training_step_that_bypasses_the_mixin_is_refused():
    with pytest.raises(TypeError, match=r"BypassingMixture.training_step bypasses MixtureWeightedMixin.training_step, so FedEM's"):
        fit(FedEM(num_components=2), model_cls=BypassingMixture)


def test_the_paper_config_runs_through_the_cli(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["fl-lightning"])
    config = Path(__file__).resolve().parents[2] / "configs" / "papers" / "fedsoft_synthetic_fedem.yaml"
    overrides = ["--trainer.max_epochs=1", "--trainer.local_epochs=1", "--trainer.clients_per_round=4"]
    quiet = ["--trainer.logger=false", "--trainer.enable_progress_bar=false", "--data.init_args.batch_size=200"]
    cli = FederatedCLI(args=["fit", "--config", str(config), *overrides, *quiet])
    assert isinstance(cli.trainer.algorithm, FedEM) and cli.trainer.algorithm.num_clusters == 2
    for key in ("src1_c1_loss", "u_error", "fedem_pi_entropy", "personal_train_loss"):
        assert f"round/{key}" in cli.trainer.callback_metrics, key
