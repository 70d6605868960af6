"""Shared set-up of the oracle tests of SCAFFOLD and FedDyn: float64 linear regression on FedSoft's
mixture federation (8 clients of 20-30 samples, batches of 10: 2 or 3 local steps per epoch)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import ModelCheckpoint

from fl_lightning import FederatedTrainer
from fl_lightning.algorithms import Algorithm
from fl_lightning.models import LinearRegression

from ..integration.conftest import QUIET
from .test_fedsoft import mixture_data

LR, ROUNDS, CLIENTS_PER_ROUND = 0.05, 4, 3


def fit(
    algorithm: Algorithm, *, rounds: int = ROUNDS, ckpt_path: Any = None, momentum: float = 0.0, **kwargs: Any
) -> tuple[LinearRegression, FederatedTrainer]:
    """``rounds`` rounds of 3 of the 8 clients, one local epoch each, SGD (plain by default), from a seeded initial model."""
    torch.manual_seed(0)
    model = LinearRegression(lr=LR, optimizer="sgd", momentum=momentum)
    settings = {
        **QUIET, "precision": "64-true", "max_epochs": rounds, "local_epochs": 1, "clients_per_round": CLIENTS_PER_ROUND,
        "limit_val_batches": 0, "algorithm": algorithm,
    }  # fmt: skip
    trainer = FederatedTrainer(**{**settings, **kwargs})
    trainer.fit(model, datamodule=mixture_data(holdout=0.0), ckpt_path=ckpt_path)
    return model, trainer


def initial_weight() -> torch.Tensor:
    """The model's weight before the first round (the same seed as :func:`fit`), in float64."""
    torch.manual_seed(0)
    return LinearRegression(lr=LR, optimizer="sgd").net.weight.detach().double().clone()


def client_batches(trainer: FederatedTrainer, round_idx: int, client_id: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The batches client ``client_id`` trained on in round ``round_idx``, in float64."""
    loop = trainer.fit_loop
    return [(x.double(), y.double()) for x, y in loop.client_batches(loop.client_context(round_idx, client_id))]


def mse_gradient(w: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The gradient of the batch's mean squared error at the weight ``w`` (``[1, d]``)."""
    w = w.clone().requires_grad_()
    (grad,) = torch.autograd.grad(F.mse_loss(x @ w.T, y), w)
    return grad


def resume_pair(algorithm_factory: Any, tmp_path: Any) -> tuple[FederatedTrainer, FederatedTrainer]:
    """An uninterrupted run and one resumed from its checkpoint after the first round, in float32: under
    ``precision="64-true"`` a resumed FedAvg is already 1e-8 off, its weights restored through float32."""
    checkpoint = ModelCheckpoint(dirpath=tmp_path, every_n_epochs=1, save_top_k=-1, filename="{epoch}")
    _, straight = fit(algorithm_factory(), callbacks=[checkpoint], enable_checkpointing=True, precision="32-true")
    _, resumed = fit(algorithm_factory(), ckpt_path=tmp_path / "epoch=0.ckpt", precision="32-true")
    return straight, resumed
