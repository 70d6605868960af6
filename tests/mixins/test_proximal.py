"""ProximalMixin's term and its gradient, and FedProx's wiring of it."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

import lightning.pytorch as pl
from fl_lightning.algorithms import FedProx
from fl_lightning.server.federation import Federation
from fl_lightning.mixins import ProximalMixin

MU = 0.3


class _Linear(pl.LightningModule):
    """A tiny regression module that remembers what its own ``training_step`` returned."""

    def __init__(self, *, as_dict: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(3, 2)
        self.as_dict = as_dict
        self.last_output: Any = None

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Any:
        x, y = batch
        loss = F.mse_loss(self.fc(x), y)
        self.last_output = {"loss": loss, "extra": 7} if self.as_dict else loss
        return self.last_output


class _ProxLinear(ProximalMixin, _Linear):
    pass


def _batch() -> tuple[Tensor, Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(5, 3, generator=g), torch.randn(5, 2, generator=g)


def _center(module: nn.Module) -> dict[str, Tensor]:
    """A global model away from the module's weights, so the proximal gradient is non-zero."""
    g = torch.Generator().manual_seed(2)
    return {name: p.detach() + torch.randn(p.shape, generator=g) for name, p in module.named_parameters()}


def _loss(output: Any) -> Tensor:
    return output["loss"] if isinstance(output, dict) else output


def _grads(module: nn.Module, loss: Tensor) -> dict[str, Tensor]:
    module.zero_grad()
    loss.backward()
    return {name: p.grad.clone() for name, p in module.named_parameters()}


@pytest.mark.parametrize("as_dict", [False, True])
def test_mu_zero_returns_the_identical_output(as_dict: bool) -> None:
    module = _ProxLinear(as_dict=as_dict)
    # Never configured: the class default is mu = 0.
    assert module.training_step(_batch(), 0) is module.last_output
    module.set_proximal_center(_center(module), 0.0)
    assert module.training_step(_batch(), 0) is module.last_output


@pytest.mark.parametrize("as_dict", [False, True])
def test_gradient_is_plain_gradient_plus_mu_times_distance(as_dict: bool) -> None:
    module = _ProxLinear(as_dict=as_dict)
    center = _center(module)
    plain = _grads(module, _loss(_Linear.training_step(module, _batch(), 0)))

    module.set_proximal_center(center, MU)
    output = module.training_step(_batch(), 0)
    prox = _grads(module, _loss(output))

    for name, p in module.named_parameters():
        expected = plain[name] + MU * (p.detach() - center[name])
        torch.testing.assert_close(prox[name], expected, rtol=0, atol=1e-6, msg=name)
        assert not torch.allclose(prox[name], plain[name]), name
    # The centre is a constant: no gradient flows into the global model.
    assert all(not c.requires_grad and c.grad is None for c in center.values())


def test_loss_value_adds_half_mu_squared_distance() -> None:
    module = _ProxLinear()
    center = _center(module)
    plain = _Linear.training_step(module, _batch(), 0).item()
    module.set_proximal_center(center, MU)
    sq = sum(((p.detach() - center[n]) ** 2).sum().item() for n, p in module.named_parameters())
    output = module.training_step(_batch(), 0)
    assert output["loss"].item() == pytest.approx(plain + 0.5 * MU * sq, rel=1e-6)
    assert module.proximal_term().item() == pytest.approx(0.5 * MU * sq, rel=1e-6)
    # The task loss and the term stay apart for logging (FedProx's train_loss compares with FedAvg's).
    assert output["task_loss"].item() == pytest.approx(plain, rel=1e-6)
    assert output["regularizer"].item() == pytest.approx(0.5 * MU * sq, rel=1e-6)


def test_dict_output_keeps_other_keys() -> None:
    module = _ProxLinear(as_dict=True)
    module.set_proximal_center(_center(module), MU)
    output = module.training_step(_batch(), 0)
    assert set(output) == {"loss", "extra", "task_loss", "regularizer"} and output["extra"] == 7
    assert output["loss"].item() > module.last_output["loss"].item()
    # The wrapped module's own dict is not mutated.
    assert output is not module.last_output


def test_frozen_parameters_are_not_pulled() -> None:
    module = _ProxLinear()
    module.fc.bias.requires_grad_(False)
    center = _center(module)
    module.set_proximal_center(center, MU)
    _loss(module.training_step(_batch(), 0)).backward()
    assert module.fc.bias.grad is None
    sq = ((module.fc.weight.detach() - center["fc.weight"]) ** 2).sum().item()
    assert module.proximal_term().item() == pytest.approx(0.5 * MU * sq, rel=1e-6)


def test_term_follows_the_live_parameters() -> None:
    module = _ProxLinear()
    center = _center(module)
    module.set_proximal_center(center, MU)
    assert module.proximal_term().item() > 0
    with torch.no_grad():
        for name, p in module.named_parameters():
            p.copy_(center[name])
    assert module.proximal_term().item() == 0.0


@pytest.mark.parametrize("mu", [-1.0, -1e-9])
def test_negative_mu_is_rejected(mu: float) -> None:
    module = _ProxLinear()
    with pytest.raises(ValueError, match=rf"Proximal coefficient `mu` must be >= 0, got {mu}\."):
        module.set_proximal_center(_center(module), mu)


def test_fedprox_rejects_negative_mu() -> None:
    with pytest.raises(ValueError, match=r"`mu` must be a finite number >= 0, got -1\."):
        FedProx(mu=-1)


class _Data:
    num_clients = 2

    def client_num_samples(self, cid: int) -> int:
        return 4

    def client_batches(self, cid, *, num_epochs=None, num_batches=None, generator):  # pragma: no cover - unused
        raise NotImplementedError


def _federation(module: pl.LightningModule) -> Federation:
    return Federation(
        data=_Data(),
        module=module,
        clients_per_round=1,
        seed=0,
        param_names=frozenset(n for n, _ in module.named_parameters()),
    )


def test_fedprox_setup_without_the_mixin_names_the_fix() -> None:
    with pytest.raises(TypeError, match=r"inherits `fl_lightning\.ProximalMixin`.*class MyModel\(ProximalMixin, _Linear\)"):
        FedProx(mu=0.1).setup(_federation(_Linear()))


def test_fedprox_configure_client_sets_center_and_mu() -> None:
    module = _ProxLinear()
    algo = FedProx(mu=MU)
    algo.setup(_federation(module))
    center = _center(module)
    algo.configure_client(None, module, center)  # type: ignore[arg-type]
    assert module._proximal_mu == MU
    sq = sum(((p.detach() - center[n]) ** 2).sum().item() for n, p in module.named_parameters())
    assert module.proximal_term().item() == pytest.approx(0.5 * MU * sq, rel=1e-6)
