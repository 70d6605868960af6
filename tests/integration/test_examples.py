"""The examples run end to end with small settings and learn; FedMedian aggregates as its reference says."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import torch

from fl_lightning import ClientUpdate

from ..quiet import QUIET

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def load_example(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def existing_project() -> ModuleType:
    return load_example("existing_project")


@pytest.fixture(scope="module")
def custom_algorithm() -> ModuleType:
    return load_example("custom_algorithm")


# Chance is 0.1 on the ten digit classes.


def test_existing_project_learns_federated(existing_project):
    assert existing_project.main(federated=True, max_epochs=10, **QUIET) > 0.6


def test_existing_project_learns_centralised(existing_project):
    assert existing_project.main(federated=False, max_epochs=2, **QUIET) > 0.8


def test_existing_project_model_is_the_users_with_the_proximal_term(existing_project):
    from fl_lightning import ProximalMixin

    federated = existing_project.FederatedDigitsClassifier
    assert issubclass(federated, existing_project.DigitsClassifier) and issubclass(federated, ProximalMixin)
    assert not issubclass(existing_project.DigitsClassifier, ProximalMixin)


def test_custom_algorithm_learns(custom_algorithm):
    assert custom_algorithm.main("fedmedian", rounds=10, **QUIET) > 0.4


def test_fedmedian_survives_the_sign_flip_attack_that_breaks_fedavg(custom_algorithm):
    median = custom_algorithm.main("fedmedian", rounds=10, byzantine=4, **QUIET)
    mean = custom_algorithm.main("fedavg", rounds=10, byzantine=4, **QUIET)
    assert mean < 0.2 and median > 0.3


def _updates(deltas: list[dict[str, torch.Tensor]]) -> list[ClientUpdate]:
    return [
        ClientUpdate(client_id=k, num_samples=10 * (k + 1), num_steps=1, payload=d, upload_bytes=0)
        for k, d in enumerate(deltas)
    ]


@pytest.mark.parametrize("num_clients", [3, 4, 5])
def test_fedmedian_aggregate_is_the_coordinate_wise_median(custom_algorithm, num_clients):
    generator = torch.Generator().manual_seed(num_clients)
    deltas = [
        {
            "weight": torch.randn(4, 3, generator=generator),
            "bias": torch.randn(3, generator=generator),
            "num_batches_tracked": torch.randint(0, 9, (), generator=generator),
        }
        for _ in range(num_clients)
    ]
    start = {"weight": torch.ones(4, 3), "bias": torch.zeros(3), "num_batches_tracked": torch.tensor(5)}
    state = {k: v.clone() for k, v in start.items()}

    metrics = custom_algorithm.FedMedian().aggregate(0, state, _updates(deltas))

    assert metrics == {}
    for name in start:
        median = torch.stack([d[name] for d in deltas]).median(dim=0).values
        torch.testing.assert_close(state[name], start[name] + median, rtol=0, atol=0)
    if num_clients % 2:
        # With an odd count the median is unambiguous: NumPy agrees, and sample counts do not matter.
        reference = np.median(np.stack([d["weight"].numpy() for d in deltas]), axis=0)
        np.testing.assert_allclose(state["weight"].numpy(), 1.0 + reference, rtol=0, atol=1e-6)


def test_fedmedian_ignores_a_minority_of_arbitrary_updates(custom_algorithm):
    honest = [{"w": torch.tensor([1.0, -1.0])}, {"w": torch.tensor([2.0, 0.0])}, {"w": torch.tensor([3.0, 1.0])}]
    byzantine = [{"w": torch.tensor([1e9, -1e9])}, {"w": torch.tensor([-1e9, 1e9])}]
    state = {"w": torch.zeros(2)}
    custom_algorithm.FedMedian().aggregate(0, state, _updates(honest + byzantine))
    assert torch.equal(state["w"], torch.tensor([2.0, 0.0]))


def test_coordinate_median_rejects_no_updates(custom_algorithm):
    with pytest.raises(ValueError, match="empty"):
        custom_algorithm.coordinate_median([])


def test_custom_algorithm_doctests(custom_algorithm):
    import doctest

    results = doctest.testmod(custom_algorithm)
    assert results.attempted > 0 and results.failed == 0
