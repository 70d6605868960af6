"""Simulated secure aggregation: pads cancel exactly, FedAvg within the quantisation error, dropout recovery."""

from __future__ import annotations

import math

import pytest
import torch

from fl_lightning import CompressedFedAvg, FedAvg, FedMRN, FedSoft, ServerSGD
from fl_lightning.algorithms import ClientContext, FedBuff
from fl_lightning.algorithms.shared.summable import can_shard
from fl_lightning.compression import TopKCodec
from fl_lightning.secure import SecureAggregation
from fl_lightning.secure.masking import decode, encode, masked
from tests.algorithms.test_fedavg import NUM_SAMPLES, _global_state, _updates, federation  # noqa: F401 (fixture)

BITS, FRACTION = 48, 20


def test_pads_cancel_exactly_in_the_sum_over_the_round():
    clients, size, modulus = [3, 7, 8, 12], 1000, 1 << BITS
    zeros = torch.zeros(size, dtype=torch.int64)
    pads = [masked(zeros, c, clients, seed=5, round_idx=2, modulus_bits=BITS) for c in clients]
    assert torch.equal(sum(pads) % modulus, zeros)
    assert not torch.equal(pads[0], zeros) and pads[0].max() > modulus // 2  # each pad spans the ring


def test_fixed_point_round_trip_and_overflow():
    x = torch.tensor([-3.25, 0.0, 1e-3, 12345.678], dtype=torch.float64)
    back = decode(encode(x, BITS, FRACTION), BITS, FRACTION)
    assert (back - x).abs().max() <= 2.0 ** -(FRACTION + 1)
    with pytest.raises(OverflowError, match="does not fit 48-bit fixed point"):
        encode(torch.tensor([2.0**30]), BITS, FRACTION)


def test_a_sum_that_would_wrap_the_ring_is_refused_before_masking():
    """The audit's case: 6 clients' 5000 * 20000 each fit 48-bit, 20-fraction fixed point (|x| < 2^27), their
    sum does not and wrapped to a wrong aggregate; a value whose sum over the round's clients could wrap is refused."""
    value = torch.tensor([5000.0 * 20000.0], dtype=torch.float64)
    six = sum(encode(value, BITS, FRACTION) for _ in range(6)) % (1 << BITS)
    assert decode(six, BITS, FRACTION).item() == 6e8 - 4 * 2.0**27  # what the modular sum gives silently: wrapped twice
    with pytest.raises(OverflowError, match="summed over 6 clients does not fit 48-bit fixed point"):
        encode(value, BITS, FRACTION, summands=6)
    assert decode(encode(value, BITS, FRACTION, summands=1), BITS, FRACTION).item() == 1e8


def test_secure_aggregation_refuses_a_client_whose_value_could_wrap_the_round_s_sum(federation):  # noqa: F811
    updates = _updates(_global_state(federation.module))
    algorithm = SecureAggregation()
    algorithm.setup(federation)
    algorithm.select_clients(0)
    update = updates[0]
    value = 2.0**27 / 3 / update.num_samples  # times the client's weight: 2^27 / 3
    big = {n: torch.full_like(t, value) if t.is_floating_point() else t for n, t in update.payload.items()}
    context = ClientContext(
        round_idx=0, client_id=update.client_id, num_samples=update.num_samples, num_epochs=1, num_steps=None, seed=0
    )
    assert len(algorithm.round_clients) == 4  # one value is 2^27 / 3: it fits alone, not four times
    with pytest.raises(OverflowError, match="summed over 4 clients does not fit"):
        algorithm.client_update(context, federation.module, big)


def _round(algorithm, federation, updates):  # noqa: F811
    """Every client's masked upload (as ``client_update`` makes it) and the global state after aggregation."""
    algorithm.setup(federation)
    clients = algorithm.select_clients(0)
    uploads = []
    for update in updates:
        context = ClientContext(
            round_idx=0, client_id=update.client_id, num_samples=update.num_samples, num_epochs=1, num_steps=None, seed=0
        )
        uploads.append(algorithm.client_update(context, federation.module, update.payload))
    state = _global_state(federation.module)
    metrics = algorithm.aggregate(0, state, [u for u in uploads if u.client_id in clients])
    return uploads, state, metrics


def test_equals_fedavg_within_the_quantisation_error(federation):  # noqa: F811
    updates = _updates(_global_state(federation.module))
    uploads, secure, metrics = _round(
        SecureAggregation(algorithm=FedAvg(server_optimizer=ServerSGD(lr=0.7))), federation, updates
    )
    plain, fedavg = _global_state(federation.module), FedAvg(server_optimizer=ServerSGD(lr=0.7))
    fedavg.setup(federation)
    fedavg.aggregate(0, plain, updates)
    # Each client rounds w_k * delta to 2^-(f+1); the sum of 4 over W = 62 samples.
    tolerance = len(updates) * 2.0 ** -(FRACTION + 1) / sum(NUM_SAMPLES) + 1e-6
    for name, value in plain.items():
        assert (secure[name].double() - value.double()).abs().max() <= tolerance, name
    assert metrics["secagg_dropped_clients"] == 0.0
    dense = 4 * sum(t.numel() for t in updates[0].payload.values())
    assert uploads[0].upload_bytes == math.ceil(BITS * (dense // 4 + 1) / 8) + 64 + 3 * 80 > dense
    plain_vector = torch.cat([t.double().reshape(-1) * NUM_SAMPLES[0] for t in updates[0].payload.values()])
    assert not torch.equal(uploads[0].payload["masked"][:-1], encode(plain_vector, BITS, FRACTION))  # masked


def test_dropped_clients_pads_are_recovered(federation):  # noqa: F811
    updates = _updates(_global_state(federation.module), seed=3)
    algorithm = SecureAggregation(dropout=0.5, min_survivors=0.25)
    algorithm.setup(federation)
    dropped = [c for c in range(4) if algorithm.drops(0, c)]
    assert 0 < len(dropped) < 4  # this seed drops some, not all
    _, secure, metrics = _round(algorithm, federation, updates)
    plain = _global_state(federation.module)
    fedavg = FedAvg()
    fedavg.setup(federation)
    fedavg.aggregate(0, plain, [u for u in updates if u.client_id not in dropped])
    for name, value in plain.items():
        assert (secure[name].double() - value.double()).abs().max() <= 1e-5, name
    assert metrics["secagg_dropped_clients"] == len(dropped)


@pytest.mark.parametrize("dropout", [0.0, 0.5], ids=["all-arrive", "three-drop"])
def test_masked_sums_of_two_shares_add_up_to_the_one_process_sum(federation, dropout):  # noqa: F811
    # Client sharding: each rank sums its clients' masked vectors; the ranks' sums are added mod 2^b.
    algorithm = SecureAggregation(dropout=dropout, min_survivors=0.25)
    uploads, one_process, _ = _round(algorithm, federation, _updates(_global_state(federation.module), seed=3))
    dropped, state = algorithm.dropped_clients(0), _global_state(federation.module)
    assert len(dropped) == (0 if dropout == 0 else 3)
    shares = [algorithm.masked_sum(0, uploads[rank::2], dropped, state) for rank in range(2)]
    algorithm.apply_masked_sum(0, state, shares[0] + shares[1], dropped)
    for name, value in one_process.items():
        assert torch.equal(state[name], value), name


def test_too_few_survivors_abort_the_round(federation):  # noqa: F811
    updates = _updates(_global_state(federation.module))
    algorithm = SecureAggregation(dropout=0.99, min_survivors=1.0)
    with pytest.warns(UserWarning, match="secure aggregation aborted"):
        _, state, _ = _round(algorithm, federation, updates)
    for name, value in _global_state(federation.module).items():
        assert torch.equal(state[name], value)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"algorithm": FedSoft(num_clusters=2)}, "payload is not a sum"),
        ({"algorithm": FedBuff(buffer_size=2)}, "payload is not a sum"),
        # Summable over decoded deltas, but the upload is a codec's bytes, which the pads cannot mask.
        ({"algorithm": FedMRN()}, "FedMRN uploads an encoded payload"),
        ({"algorithm": CompressedFedAvg(codec=TopKCodec(density=0.1))}, "CompressedFedAvg uploads an encoded payload"),
        ({"modulus_bits": 63}, "modulus_bits"),
        ({"fraction_bits": 47}, "fraction_bits"),
        ({"dropout": 1.0}, "dropout"),
        ({"min_survivors": 0.0}, "min_survivors"),
    ],
)
def test_bad_input_is_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SecureAggregation(**kwargs)


def test_the_server_sees_no_individual_update():
    algorithm = SecureAggregation()
    assert not algorithm.uploads_deltas and not can_shard(algorithm)
