"""A federation of 4 clients over a module with enough weights for statistical checks."""

from __future__ import annotations

import lightning.pytorch as pl
import pytest
import torch
from torch import nn

from fl_lightning.algorithms import ClientUpdate
from fl_lightning.server.federation import Federation
from tests.algorithms.test_fedavg import _Data, _global_state


class WideNet(pl.LightningModule):
    """100 100 weights, a BatchNorm (with an integer counter) and nothing else."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(1000, 100)
        self.bn = nn.BatchNorm1d(2)


def make_federation(clients_per_round: int = 4, seed: int = 0) -> Federation:
    module = WideNet()
    return Federation(
        data=_Data(),
        module=module,
        clients_per_round=clients_per_round,
        seed=seed,
        param_names=frozenset(name for name, _ in module.named_parameters()),
    )


@pytest.fixture
def federation() -> Federation:
    return make_federation()


def global_state(federation: Federation) -> dict[str, torch.Tensor]:
    return _global_state(federation.module)


def updates_with_norms(state: dict[str, torch.Tensor], norms: list[float], seed: int = 0) -> list[ClientUpdate]:
    """One update per norm: a random direction over the float tensors, scaled to exactly that L2 norm."""
    g = torch.Generator().manual_seed(seed)
    updates = []
    for cid, norm in enumerate(norms):
        payload = {
            k: torch.randn(v.shape, generator=g, dtype=torch.float64) if v.is_floating_point() else torch.tensor(3)
            for k, v in state.items()
        }
        size = torch.sqrt(sum((t**2).sum() for t in payload.values() if t.is_floating_point()))
        payload = {k: (t * (norm / size)).float() if t.is_floating_point() else t for k, t in payload.items()}
        updates.append(ClientUpdate(client_id=cid, num_samples=10, num_steps=1, payload=payload, upload_bytes=0))
    return updates
