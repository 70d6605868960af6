"""LocalOnly (FedALIGN App. C.1): each client's model trained only on its own data, scored on its own held-out data."""

from __future__ import annotations

import pytest
import torch

from fl_lightning import FedALIGN, FederatedTrainer, LocalOnly, PriorityOnly
from fl_lightning.data import Digits, Dirichlet, FederatedDataModule
from fl_lightning.models import MLP
from fl_lightning.evaluation.probe import sample_metrics

from ..integration.conftest import QUIET

ROUNDS = 2


def data() -> FederatedDataModule:
    return FederatedDataModule(
        Digits(split="train"), Digits(split="test"), partitioner=Dirichlet(alpha=0.5), num_clients=6, batch_size=16, holdout_fraction=0.2
    )


def fit(algorithm) -> tuple[MLP, FederatedTrainer]:
    torch.manual_seed(0)
    model = MLP(in_features=64, hidden=(16,), lr=0.1)
    trainer = FederatedTrainer(**{**QUIET, "max_epochs": ROUNDS, "seed": 1, "algorithm": algorithm, "limit_val_batches": 0})
    trainer.fit(model, datamodule=data())
    return model, trainer


def test_a_local_model_is_the_client_training_alone_round_after_round():
    # FedAvg over client 4 alone makes the global model that client's own model, round after round.
    alone, _ = fit(PriorityOnly(priority=[4], warmup_fraction=0.0))
    local = LocalOnly(clients=[1, 4])
    model, _ = fit(local)
    for name, value in alone.state_dict().items():
        torch.testing.assert_close(local.models.get(4)[name], value.cpu(), rtol=0, atol=1e-6)  # FedAvg adds a delta
    assert not torch.equal(local.models.get(1)["net.1.weight"], local.models.get(4)["net.1.weight"])
    torch.manual_seed(0)
    untouched = MLP(in_features=64, hidden=(16,), lr=0.1)
    for name, value in untouched.state_dict().items():  # the global model never moves
        torch.testing.assert_close(model.state_dict()[name], value, rtol=0, atol=0)


def test_local_accuracy_pools_each_clients_own_model_on_its_own_heldout_samples():
    local = LocalOnly(clients=[0, 2, 5])
    model, trainer = fit(local)
    datamodule = trainer.datamodule
    correct, total = 0.0, 0
    for cid in (0, 2, 5):
        model.load_state_dict(local.models.get(cid))
        scores = sample_metrics(model, datamodule.holdout_dataloader(cid))["correct"]
        correct, total = correct + float(scores.sum()), total + len(scores)
    assert trainer.callback_metrics["round/local_test_acc"].item() == pytest.approx(correct / total, abs=1e-6)
    assert 0.3 < correct / total <= 1.0  # trained, not chance


def test_fedalign_scores_the_global_model_on_the_same_clients_data():
    model, trainer = fit(FedALIGN(priority=[0, 1], warmup_fraction=0.0, evaluate_clients=[2, 3]))
    datamodule = trainer.datamodule
    scores = torch.cat([sample_metrics(model, datamodule.holdout_dataloader(c))["correct"] for c in (2, 3)])
    assert trainer.callback_metrics["round/local_test_acc"].item() == pytest.approx(float(scores.mean()), abs=1e-6)


@pytest.mark.parametrize(("clients", "error"), [([], ValueError), ([0, 9], ValueError), ("01", TypeError)])
def test_bad_client_ids_are_rejected(clients, error):
    with pytest.raises(error, match="clients"):
        fit(LocalOnly(clients=clients))


def test_heldout_data_is_required():
    torch.manual_seed(0)
    trainer = FederatedTrainer(**{**QUIET, "max_epochs": 1, "algorithm": LocalOnly(clients=[0]), "limit_val_batches": 0})
    plain = FederatedDataModule(Digits(split="train"), Digits(split="test"), num_clients=4)
    with pytest.raises(ValueError, match="holdout_fraction"):
        trainer.fit(MLP(in_features=64, hidden=(16,)), datamodule=plain)


def test_a_checkpoint_from_before_the_client_store_loads():
    own = {"net.1.weight": torch.randn(3, 4), "net.1.bias": torch.zeros(3)}
    local = LocalOnly()
    local.load_state_dict({"models": {2: own}})  # the dict of models LocalOnly kept before the client store
    assert local.models.ids() == [2]
    for name, value in own.items():
        assert torch.equal(local.models.get(2)[name], value)
    again = LocalOnly()
    again.load_state_dict(local.state_dict())  # and the store's own layout
    assert again.models.ids() == [2] and torch.equal(again.models.get(2)["net.1.weight"], own["net.1.weight"])
