"""FedAvg's aggregation: sample vs uniform weighting against NumPy, server optimizer plumbing."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import lightning.pytorch as pl
from fl_lightning.algorithms import ClientUpdate, FedAvg, ServerAdam, ServerSGD
from fl_lightning.server.federation import Federation

NUM_SAMPLES = [12, 3, 40, 7]


class _Data:
    """The smallest FederatedDataSource: only the sizes matter to aggregation."""

    num_clients = len(NUM_SAMPLES)

    def client_num_samples(self, cid: int) -> int:
        return NUM_SAMPLES[cid]

    def client_batches(self, cid, *, num_epochs=None, num_batches=None, generator):  # pragma: no cover - unused
        raise NotImplementedError


class _Net(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 2)
        self.bn = nn.BatchNorm1d(2)


@pytest.fixture
def federation() -> Federation:
    module = _Net()
    return Federation(
        data=_Data(),
        module=module,
        clients_per_round=len(NUM_SAMPLES),
        seed=0,
        param_names=frozenset(name for name, _ in module.named_parameters()),
    )


def _global_state(module: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone().float() if v.is_floating_point() else v.detach().clone() for k, v in module.state_dict().items()}


def _updates(global_state: dict[str, torch.Tensor], seed: int = 0) -> list[ClientUpdate]:
    g = torch.Generator().manual_seed(seed)
    updates = []
    for cid, n in enumerate(NUM_SAMPLES):
        payload = {
            k: torch.randn(v.shape, generator=g) if v.is_floating_point() else torch.tensor(n // 3 + cid)
            for k, v in global_state.items()
        }
        updates.append(ClientUpdate(client_id=cid, num_samples=n, num_steps=1, payload=payload, upload_bytes=0))
    return updates


def _np_expected(global_state, updates, weights) -> dict[str, np.ndarray]:
    w = np.asarray(weights, dtype=np.float64)
    out = {}
    for name, x in global_state.items():
        mean = sum(wk * u.payload[name].numpy().astype(np.float64) for wk, u in zip(w, updates)) / w.sum()
        out[name] = x.numpy() + (np.rint(mean) if not x.is_floating_point() else mean)
    return out


@pytest.mark.parametrize(
    ("weighting", "weights"),
    [("samples", NUM_SAMPLES), ("uniform", [1.0] * len(NUM_SAMPLES))],
)
def test_aggregate_matches_numpy(federation: Federation, weighting: str, weights: list[float]) -> None:
    algo = FedAvg(weighting=weighting)  # type: ignore[arg-type]
    algo.setup(federation)
    state = _global_state(federation.module)
    updates = _updates(state)
    expected = _np_expected(state, updates, weights)
    metrics = algo.aggregate(0, state, updates)
    assert metrics == {}
    assert state.keys() == expected.keys()
    for name, value in state.items():
        np.testing.assert_allclose(value.numpy(), expected[name], rtol=1e-6, atol=1e-6, err_msg=name)
    assert state["bn.num_batches_tracked"].dtype == torch.int64


def test_sample_and_uniform_weighting_differ(federation: Federation) -> None:
    results = []
    for weighting in ("samples", "uniform"):
        algo = FedAvg(weighting=weighting)  # type: ignore[arg-type]
        algo.setup(federation)
        state = _global_state(federation.module)
        algo.aggregate(0, state, _updates(state))
        results.append(state["fc.weight"])
    assert not torch.allclose(*results)


def test_aggregate_over_a_subset_of_reporting_clients(federation: Federation) -> None:
    algo = FedAvg()
    algo.setup(federation)
    state = _global_state(federation.module)
    updates = _updates(state)[1:3]
    expected = _np_expected(state, updates, [u.num_samples for u in updates])
    algo.aggregate(0, state, updates)
    np.testing.assert_allclose(state["fc.weight"].numpy(), expected["fc.weight"], rtol=1e-6, atol=1e-6)


def test_explicit_plain_server_sgd_equals_default(federation: Federation) -> None:
    states = []
    for algo in (FedAvg(), FedAvg(server_optimizer=ServerSGD(lr=1, momentum=0))):
        algo.setup(federation)
        state = _global_state(federation.module)
        for round_idx in range(3):
            algo.aggregate(round_idx, state, _updates(state, seed=round_idx))
        states.append(state)
    for name in states[0]:
        assert torch.equal(states[0][name], states[1][name]), name


def test_default_server_optimizer_is_plain_sgd() -> None:
    opt = FedAvg().server_optimizer
    assert isinstance(opt, ServerSGD) and opt.lr == 1.0 and opt.momentum == 0.0


def test_server_optimizer_sees_only_parameters(federation: Federation) -> None:
    algo = FedAvg(server_optimizer=ServerAdam(lr=0.1))
    algo.setup(federation)
    state = _global_state(federation.module)
    algo.aggregate(0, state, _updates(state))
    assert set(algo.server_optimizer.state["m"]) == federation.param_names == {"fc.weight", "fc.bias", "bn.weight", "bn.bias"}


def test_state_dict_round_trip(federation: Federation) -> None:
    algo = FedAvg(server_optimizer=ServerSGD(lr=0.5, momentum=0.9))
    algo.setup(federation)
    state = _global_state(federation.module)
    algo.aggregate(0, state, _updates(state))
    saved = algo.state_dict()
    assert set(saved) == {"server_optimizer"}

    resumed = FedAvg(server_optimizer=ServerSGD(lr=0.5, momentum=0.9))
    resumed.setup(federation)
    resumed.load_state_dict(saved)
    state_resumed = {k: v.clone() for k, v in state.items()}
    algo.aggregate(1, state, _updates(state, seed=1))
    resumed.aggregate(1, state_resumed, _updates(state_resumed, seed=1))
    assert torch.equal(state["fc.weight"], state_resumed["fc.weight"])


@pytest.mark.parametrize("weighting", ["sample", "Uniform", None, "examples"])
def test_bad_weighting(weighting) -> None:
    with pytest.raises(ValueError, match=rf"`weighting` must be 'samples' or 'uniform', got {weighting!r}\."):
        FedAvg(weighting=weighting)  # type: ignore[arg-type]
