"""A data source may hand out a client's batches as any iterable: a list, a tuple, a generator."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import pytest
import torch
from lightning.pytorch import LightningDataModule

from fl_lightning.data import FederatedDataModule
from fl_lightning.models import MLP
from tests.integration.conftest import digits_data, quiet_trainer


class _Reshaped(LightningDataModule):
    """A ``FederatedDataSource`` serving the same batches as a datamodule, in another container."""

    def __init__(self, data: FederatedDataModule, container: Callable[[Iterable[Any]], Iterable[Any]]) -> None:
        super().__init__()
        self.data, self.container = data, container
        self.num_clients = data.num_clients

    def client_num_samples(self, cid: int) -> int:
        return self.data.client_num_samples(cid)

    def client_batches(self, cid: int, **kwargs: Any) -> Iterable[Any]:
        return self.container(self.data.client_batches(cid, **kwargs))


def _generator(batches: Iterable[Any]) -> Iterable[Any]:
    yield from batches


def _fit(data: Any, executor: str) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    model = MLP(in_features=64, hidden=[16])
    trainer = quiet_trainer(max_epochs=2, clients_per_round=3, local_epochs=1, client_executor=executor)
    trainer.fit(model, datamodule=data)
    return model.state_dict()


@pytest.mark.parametrize("executor", ["lightning", "lean", "batched"])
@pytest.mark.parametrize("container", [list, tuple, _generator], ids=["list", "tuple", "generator"])
def test_every_container_trains_like_the_datamodule_under_every_executor(container, executor: str) -> None:
    reference = _fit(digits_data(num_clients=6), executor)
    reshaped = _fit(_Reshaped(digits_data(num_clients=6), container), executor)
    for name, value in reference.items():
        torch.testing.assert_close(reshaped[name], value, rtol=0, atol=0, msg=name)
