"""ClientSharding in one process: the share of each rank, the packed all-reduce, strategy selection."""

from __future__ import annotations

import copy
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy

from fl_lightning import CompressedFedAvg, FedALIGN, FedAvg, FedBuff, FederatedTrainer, FedPM, FedProx, FedSoft, ServerAdam
from fl_lightning.algorithms.shared.summable import apply_sum
from fl_lightning.compression import TopKCodec, as_wire, from_wire
from fl_lightning.distributed import ClientSharding, FederatedDDPStrategy
from fl_lightning.loops.guards import decode_and_screen
from fl_lightning.robust import CoordinateMedian
from tests.algorithms.test_fedavg import _global_state, _updates, federation  # noqa: F401 (fixture)


class _SummingStrategy:
    """A stand-in for a DDP strategy: ``reduce`` adds the buffers the other ranks contributed."""

    def __init__(self, rank: int, world_size: int, others: list[torch.Tensor] | None = None) -> None:
        self.global_rank, self.world_size, self.root_device = rank, world_size, torch.device("cpu")
        self.others, self.sent = others or [], None

    def reduce(self, buffer: torch.Tensor, reduce_op: str) -> torch.Tensor:
        assert reduce_op == "sum"
        self.sent = buffer.clone()
        return buffer + sum(self.others, torch.zeros_like(buffer))


@pytest.mark.parametrize("world_size", [1, 2, 3, 7])
def test_shares_are_disjoint_ordered_and_cover_the_round(world_size):
    clients = [9, 2, 5, 11, 0, 4, 8]
    shares = [ClientSharding(_SummingStrategy(r, world_size)).share(clients) for r in range(world_size)]
    assert sorted(c for share in shares for c in share) == sorted(clients)
    for share in shares:
        assert share == [c for c in clients if c in share]  # selection order kept


@pytest.mark.parametrize("server_optimizer", [None, ServerAdam(lr=0.1)], ids=["fedavg", "fedadam"])
def test_two_shards_and_one_reduce_equal_fedavg_over_all_clients(federation, server_optimizer):  # noqa: F811
    algorithm = FedAvg(server_optimizer=server_optimizer)
    algorithm.setup(federation)
    sharded_algorithm = copy.deepcopy(algorithm)
    global_state = _global_state(federation.module)
    updates = _updates(global_state)
    for u, loss in zip(updates, [0.5, 1.5, 2.5, 3.5]):
        u.metrics["train_loss"], u.upload_bytes = loss, 100 + u.client_id
    clients = [u.client_id for u in updates]

    expected = {k: v.clone() for k, v in global_state.items()}
    algorithm.aggregate(0, expected, updates)

    def contribute(strategy: _SummingStrategy):
        sharding = ClientSharding(strategy)
        local = [u for u in updates if u.client_id in sharding.share(clients)]
        partial = sharded_algorithm.weighted_delta_sum(local)
        return sharding.all_reduce(clients, local, set(), partial, global_state, stop=False)

    rank1 = _SummingStrategy(1, 2)
    with pytest.raises(RuntimeError, match="lost or duplicated"):  # half a round, on its own
        contribute(rank1)
    combined = contribute(_SummingStrategy(0, 2, others=[rank1.sent]))
    got = {k: v.clone() for k, v in global_state.items()}
    sharded_algorithm.apply_weighted_sum(0, got, combined.total, combined.weight)

    for name in expected:
        assert got[name].dtype == expected[name].dtype
        torch.testing.assert_close(got[name], expected[name], rtol=0, atol=1e-6)
    assert combined.weight == sum(u.num_samples for u in updates)
    assert [r.client_id for r in combined.reports] == clients
    assert [r.metrics["train_loss"] for r in combined.reports] == [0.5, 1.5, 2.5, 3.5]
    assert [r.upload_bytes for r in combined.reports] == [100, 101, 102, 103]
    assert combined.dropped == 0 and not combined.stop


@pytest.mark.filterwarnings("ignore:Round 0. client 3 sent an undecodable payload")
def test_compressed_uploads_decoded_and_summed_per_rank_equal_one_aggregation(federation):  # noqa: F811
    # Each rank decodes and sums the Top-k uploads of its clients; client 3's upload (rank 1) is malformed.
    algorithm = CompressedFedAvg(codec=TopKCodec(density=0.5), server_optimizer=ServerAdam(lr=0.1))
    algorithm.setup(federation)
    sharded_algorithm = copy.deepcopy(algorithm)
    global_state = _global_state(federation.module)
    uploads = []
    for update in _updates(global_state):
        data = algorithm.codec.encode(update.payload, algorithm.layout)
        uploads.append(replace(update, payload=as_wire(data), upload_bytes=len(data)))
    short = from_wire(uploads[3].payload)[:-1]
    uploads[3] = replace(uploads[3], payload=as_wire(short), upload_bytes=len(short))
    clients = [u.client_id for u in uploads]

    expected = {k: v.clone() for k, v in global_state.items()}
    expected_metrics = algorithm.aggregate(0, expected, decode_and_screen(algorithm, 0, uploads).finite)

    def contribute(strategy: _SummingStrategy):
        sharding = ClientSharding(strategy)
        local = [u for u in uploads if u.client_id in sharding.share(clients)]
        screened = decode_and_screen(sharded_algorithm, 0, local)
        partial = sharded_algorithm.weighted_delta_sum(screened.finite)
        return sharding.all_reduce(clients, local, set(), partial, global_state, stop=False, rejected_ids=set(screened.rejected))

    rank1 = _SummingStrategy(1, 2)
    with pytest.raises(RuntimeError, match="lost or duplicated"):  # half a round, on its own
        contribute(rank1)
    combined = contribute(_SummingStrategy(0, 2, others=[rank1.sent]))
    got = {k: v.clone() for k, v in global_state.items()}
    metrics = apply_sum(sharded_algorithm, 0, got, combined.total, combined.weight, combined.aggregated)

    assert combined.rejected == 1 and [r.client_id for r in combined.aggregated] == [0, 1, 2]
    assert metrics == expected_metrics and metrics["payload_bytes"] == uploads[0].upload_bytes  # not the short one
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=0, atol=1e-6)
    assert any(not torch.equal(got[name], global_state[name]) for name in got)


def test_dropped_clients_stop_flag_and_missing_losses_travel_in_the_reduce(federation):  # noqa: F811
    global_state = _global_state(federation.module)
    updates = _updates(global_state)
    sharding = ClientSharding(_SummingStrategy(0, 1))
    combined = sharding.all_reduce([0, 1, 2, 3], updates, {1, 3}, ({}, 0.0), global_state, stop=True)
    assert combined.dropped == 2 and combined.stop and combined.weight == 0.0
    assert [r.client_id for r in combined.aggregated] == [0, 2]
    assert all(r.metrics == {} for r in combined.reports)
    assert all(torch.count_nonzero(t) == 0 for t in combined.total.values())


def test_every_rank_gathers_every_decoded_payload_exactly(federation):  # noqa: F811
    template = _global_state(federation.module)
    updates = _updates(template, seed=2)  # float deltas and integer counters
    clients = [u.client_id for u in updates]
    rank1 = _SummingStrategy(1, 2)
    ClientSharding(rank1).gather_payloads(clients, updates[1:2], template)  # its other client was dropped
    gathered = ClientSharding(_SummingStrategy(0, 2, others=[rank1.sent])).gather_payloads(clients, updates[0:3:2], template)

    assert list(gathered) == clients[:3]  # every client some rank sent, in selection order
    for update in updates[:3]:
        for name, value in update.payload.items():
            got = gathered[update.client_id][name]
            assert got.dtype == template[name].dtype and torch.equal(got, value.to(got.dtype))


def test_a_client_trained_by_no_rank_or_two_is_an_error(federation):  # noqa: F811
    global_state = _global_state(federation.module)
    updates = _updates(global_state)
    with pytest.raises(RuntimeError, match="lost or duplicated clients"):
        ClientSharding(_SummingStrategy(0, 1)).all_reduce([0, 1, 2, 3], updates[:3], set(), ({}, 0.0), global_state, stop=False)


@pytest.mark.parametrize(("name", "start_method"), [("ddp", "popen"), ("ddp_spawn", "spawn"), ("ddp_fork", "fork")])
def test_ddp_strategy_names_select_the_federated_strategy(name, start_method):
    trainer = FederatedTrainer(strategy=name, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False)
    assert isinstance(trainer.strategy, FederatedDDPStrategy)
    assert trainer.strategy._start_method == start_method


def test_a_plain_ddp_strategy_or_unknown_name_is_refused():
    with pytest.raises(ValueError, match="all-reduces gradients on every step.*strategy='ddp'"):
        FederatedTrainer(strategy=DDPStrategy(), accelerator="cpu", devices=1)
    with pytest.raises(ValueError, match="Unknown DDP strategy 'ddp_typo'"):
        FederatedTrainer(strategy="ddp_typo", accelerator="cpu", devices=1)


def _sharding_error(algorithm, strategy) -> str:
    loop = FederatedTrainer(algorithm=algorithm, accelerator="cpu", logger=False, enable_progress_bar=False).fit_loop
    loop.trainer = SimpleNamespace(strategy=strategy, world_size=2)
    with pytest.raises(ValueError) as error:
        loop._client_sharding()
    return str(error.value)


@pytest.mark.parametrize(
    "algorithm",
    [
        FedPM(),
        FedBuff(buffer_size=2),
        FedALIGN(priority=2, algorithm=FedPM()),
        CoordinateMedian(algorithm=FedSoft(num_clusters=2)),
    ],
    ids=["fedpm-averages-masks", "async", "fedalign-over-fedpm", "robust-over-fedsoft"],
)
def test_algorithms_that_are_not_a_weighted_sum_refuse_to_shard(algorithm):
    message = _sharding_error(algorithm, FederatedDDPStrategy())
    assert type(algorithm).__name__ in message and "devices=1" in message


def test_sharding_needs_the_federated_strategy():
    assert "SingleDeviceStrategy" in _sharding_error(FedProx(mu=0.1), SingleDeviceStrategy(torch.device("cpu")))


def test_a_sum_over_tensors_the_global_model_lacks_is_refused_not_dropped():
    # The all-reduce buffer is laid out from the global model: an extra summed tensor was silently lost on 2+ ranks.
    sharding = ClientSharding(SimpleNamespace(root_device=torch.device("cpu")))  # type: ignore[arg-type]
    w = torch.ones(2)
    with pytest.raises(RuntimeError, match=r"\['tau'\] that the global model lacks"):
        sharding.all_reduce([0], [], set(), ({"w": w, "tau": torch.ones(1)}, 1.0), {"w": w}, stop=False)
