"""A tiny federation with feature shift (each client's inputs scaled and offset differently, FedBN's setting)
and plain-PyTorch helpers for the oracles of Ditto and FedBN."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import torch
from torch import Tensor

from fl_lightning.data import FederatedDataModule, InMemoryDataset, Natural

NUM_CLIENTS, SAMPLES, FEATURES, CLASSES, BATCH = 4, 12, 5, 3, 4


def feature_shift_data(*, holdout_fraction: float = 0.0) -> FederatedDataModule:
    """``NUM_CLIENTS`` clients of ``SAMPLES`` samples; client ``k``'s features are ``(1 + k) x + 2k``."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(NUM_CLIENTS * SAMPLES, FEATURES, generator=generator)
    labels = (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long()
    client = torch.arange(NUM_CLIENTS).repeat_interleave(SAMPLES)
    inputs = x * (1 + client[:, None]) + 2.0 * client[:, None]
    dataset = InMemoryDataset(inputs=inputs, labels=labels, num_classes=CLASSES)
    dataset.client_ids = np.repeat(np.arange(NUM_CLIENTS), SAMPLES)
    return FederatedDataModule(
        dataset, partitioner=Natural(), num_clients=NUM_CLIENTS, batch_size=BATCH, holdout_fraction=holdout_fraction
    )


def sgd_steps(params: dict[str, Tensor], loss_fn: Any, batches: Iterable[Any], lr: float) -> dict[str, Tensor]:
    """Plain SGD on ``loss_fn(params, x, y)`` over ``batches`` (inputs in float64), from a copy of ``params``."""
    params = {k: v.detach().clone().requires_grad_() for k, v in params.items()}
    for x, y in batches:
        grads = torch.autograd.grad(loss_fn(params, x.double(), y), list(params.values()))
        params = {k: (v - lr * g).detach().requires_grad_() for (k, v), g in zip(params.items(), grads, strict=True)}
    return {k: v.detach() for k, v in params.items()}
