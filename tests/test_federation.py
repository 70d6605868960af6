"""Federation: what an algorithm knows about the federation, its generators, local weights and services."""

from __future__ import annotations

import pytest
import torch

from fl_lightning.data import FederatedDataModule, InMemoryDataset
from fl_lightning.server.federation import Federation, require_federated_data
from fl_lightning.server.services import ServerServices


class Sizes:
    """Three clients of 2, 5 and 3 samples (no batches needed)."""

    num_clients = 3

    def client_num_samples(self, cid):
        return [2, 5, 3][cid]

    def client_batches(self, cid, **kwargs):
        return []


def federation(module: torch.nn.Module | None = None, data=None) -> Federation:
    module = module if module is not None else torch.nn.Linear(2, 1)
    return Federation(data=data or Sizes(), module=module, clients_per_round=2, seed=7, param_names=frozenset())


def test_sizes_and_counts_come_from_the_data():
    fed = federation()
    assert fed.num_clients == 3
    assert fed.num_samples.tolist() == [2, 5, 3]


def draw(fed: Federation, *keys: int | str) -> torch.Tensor:
    return torch.rand(3, generator=fed.generator(*keys))


def test_generators_are_seeded_by_the_root_seed_and_the_keys():
    a, b = federation(), federation()
    assert torch.equal(draw(a, "select", 0), draw(b, "select", 0))
    assert not torch.equal(draw(a, "select", 0), draw(a, "select", 1))
    assert not torch.equal(draw(a, "select", 0), draw(a, "probe", 0))


def test_probe_batches_cover_the_clients_data_once():
    x = torch.arange(20, dtype=torch.float32).reshape(10, 2)
    data = FederatedDataModule(InMemoryDataset(inputs=x, labels=torch.zeros(10, dtype=torch.int64), num_classes=2), num_clients=2, batch_size=2)
    data.setup("fit")
    fed = federation(data=data)
    seen = torch.cat([inputs for inputs, _ in fed.probe_batches(1, batch_size=3)])
    assert sorted(seen[:, 0].tolist()) == sorted(x[data.client_indices(1)][:, 0].tolist())


def test_local_weights_share_storage_with_the_module():
    module = torch.nn.Linear(2, 1)
    fed = federation(module)
    fed.load_local_weights({"weight": torch.ones(1, 2), "bias": torch.full((1,), 3.0)})
    assert torch.equal(module.weight.detach(), torch.ones(1, 2)) and module.bias.item() == 3.0
    assert fed.local_weights()["weight"] is module.weight


def test_services_outside_a_fit_name_themselves_and_the_metrics_channel_works():
    services = federation().services
    assert type(services) is ServerServices
    for call in (
        services.optimizer_states,
        lambda: services.load_optimizer_states(None),
        lambda: services.restart_lr_schedules(0),
        services.reload_evaluation_data,
        lambda: services.accumulate_grad_batches,
        lambda: services.train_client(0, 0, seed=0),
        lambda: services.train_client_later(0, 0, seed=0),
        services.optimizers,
        services.lr_scheduler_intervals,
    ):
        with pytest.raises(RuntimeError, match=r"`Federation.services\.\w+` needs the federated loop: run the algorithm through FederatedTrainer.fit"):
            call()
    services.report_round_metrics({"a": 1.0})
    services.report_round_metrics({"b": 2.0})
    assert services.pop_round_metrics() == {"a": 1.0, "b": 2.0}
    assert services.pop_round_metrics() == {}


def test_data_without_the_federated_interface_is_refused_naming_its_type():
    with pytest.raises(TypeError, match="FederatedTrainer needs federated data.*got list"):
        require_federated_data([1, 2])
