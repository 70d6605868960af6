"""The loop's per-client tensors (issue 37): frozen buffers put back before every client, local tensors kept per
client unless training made them non-finite."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fl_lightning import FederatedCallback, FederatedParameters
from fl_lightning.models import LogisticRegression

from .faults.aggregate_helpers import Poison, tiny_data, tiny_trainer


class FrozenNormBase(LogisticRegression):
    """A frozen Linear + BatchNorm base (in training mode its running statistics would move) under a trainable head."""

    def __init__(self) -> None:
        super().__init__(in_features=4, num_classes=2, lr=0.1)
        self.base = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4)).requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(self.base(x))


class RunningMeanAtStart(FederatedCallback):
    """The frozen BatchNorm's running mean each client starts from."""

    def __init__(self) -> None:
        self.seen: list[torch.Tensor] = []

    def on_client_start(self, trainer, pl_module, client) -> None:
        self.seen.append(pl_module.base[1].running_mean.clone())


def test_a_frozen_modules_buffers_are_frozen_and_put_back_before_every_client() -> None:
    torch.manual_seed(0)
    model = FrozenNormBase()
    initial = {k: v.clone() for k, v in model.base.state_dict().items()}
    recorder = RunningMeanAtStart()
    trainer = tiny_trainer(max_epochs=2, clients_per_round=2, callbacks=[recorder])
    trainer.fit(model, datamodule=tiny_data())
    kinds = trainer.fit_loop.kinds
    assert set(kinds.frozen) == {f"base.{k}" for k in initial}  # the buffers follow their frozen module
    assert len(recorder.seen) == 4 and all(torch.equal(seen, initial["1.running_mean"]) for seen in recorder.seen)
    assert all(torch.equal(model.base.state_dict()[k], v) for k, v in initial.items())


@pytest.mark.filterwarnings("ignore:Round .. client 0 sent a non-finite update")
def test_a_client_whose_local_tensors_went_non_finite_keeps_its_previous_ones() -> None:
    torch.manual_seed(0)
    model = LogisticRegression(in_features=3, num_classes=2, lr=0.1)
    # The victim's local bias is poisoned after its update is packed; its store entry must not be.
    trainer = tiny_trainer(
        max_epochs=2, clients_per_round=4, federated_parameters=FederatedParameters(local=["net.1.bias"]),
        callbacks=[PoisonLocal({0})], client_executor="lightning",
    )
    trainer.fit(model, datamodule=tiny_data())
    store = trainer.fit_loop.client_tensors.store
    assert store.ids() == [1, 2, 3] and all(torch.isfinite(store.get(c)["net.1.bias"]).all() for c in store.ids())


class PoisonLocal(Poison):
    """Makes the victims' local bias NaN before the loop keeps it (``on_train_batch_end`` is too early for lean)."""

    def __init__(self, victims: set[int]) -> None:
        super().__init__(victims, float("nan"))

    def on_client_start(self, trainer, pl_module, client) -> None:
        self._client = client.client_id

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        if self._client in self.victims:
            pl_module.net[1].bias.grad.fill_(float("nan"))
