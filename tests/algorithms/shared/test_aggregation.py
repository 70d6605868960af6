"""``weighted_sum`` / ``weighted_average`` / ``apply_delta`` against NumPy references."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fl_lightning.algorithms.shared.aggregation import apply_delta, weighted_average, weighted_sum

NUM_CLIENTS = 5


def _random_deltas(num_clients: int, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    """Per-client deltas with a float matrix, a float vector and an int64 counter (like BatchNorm's)."""
    g = torch.Generator().manual_seed(seed)
    return [
        {
            "weight": torch.randn(3, 4, generator=g),
            "bias": torch.randn(4, generator=g),
            "num_batches_tracked": torch.randint(0, 20, (), generator=g, dtype=torch.int64),
        }
        for _ in range(num_clients)
    ]


def _np_weighted_sum(deltas: list[dict[str, torch.Tensor]], weights: list[float]) -> dict[str, np.ndarray]:
    return {
        name: sum(w * d[name].numpy().astype(np.float64) for d, w in zip(deltas, weights))
        for name in deltas[0]
    }


@pytest.fixture
def deltas() -> list[dict[str, torch.Tensor]]:
    return _random_deltas(NUM_CLIENTS)


WEIGHTS = [[3.0, 1.0, 0.5, 7.0, 2.0], [1, 1, 1, 1, 1], [120, 7, 33, 1, 64]]


@pytest.mark.parametrize("weights", WEIGHTS)
def test_weighted_sum_matches_numpy(deltas: list[dict[str, torch.Tensor]], weights: list[float]) -> None:
    result = weighted_sum(deltas, weights)
    expected = _np_weighted_sum(deltas, weights)
    assert result.keys() == expected.keys()
    for name, value in result.items():
        # Float tensors accumulate in float32, integer counters in float64, unrounded.
        assert value.dtype == (torch.float32 if deltas[0][name].is_floating_point() else torch.float64), name
        assert value.shape == deltas[0][name].shape, name
        np.testing.assert_allclose(value.numpy(), expected[name], rtol=1e-6, atol=1e-5, err_msg=name)


@pytest.mark.parametrize("weights", WEIGHTS)
def test_weighted_average_matches_numpy(deltas: list[dict[str, torch.Tensor]], weights: list[float]) -> None:
    result = weighted_average(deltas, weights)
    norm = float(sum(weights))
    for name, value in _np_weighted_sum(deltas, weights).items():
        assert result[name].dtype == (torch.float32 if deltas[0][name].is_floating_point() else torch.float64), name
        np.testing.assert_allclose(result[name].numpy(), value / norm, rtol=1e-6, atol=1e-6, err_msg=name)


def test_weighted_average_of_integer_counters_is_unrounded() -> None:
    deltas = [{"n": torch.tensor(3)}, {"n": torch.tensor(4)}]
    assert weighted_average(deltas, [1, 1])["n"].item() == pytest.approx(3.5)


def test_aggregation_is_reproducible_and_leaves_inputs_untouched(deltas: list[dict[str, torch.Tensor]]) -> None:
    before = [{k: v.clone() for k, v in d.items()} for d in deltas]
    first = weighted_average(deltas, WEIGHTS[0])
    second = weighted_average(deltas, WEIGHTS[0])
    for name in first:
        assert torch.equal(first[name], second[name]), name
    for d, b in zip(deltas, before):
        for name in d:
            assert torch.equal(d[name], b[name]), name


def test_single_client_average_is_its_delta(deltas: list[dict[str, torch.Tensor]]) -> None:
    result = weighted_average(deltas[:1], [42])
    for name in ("weight", "bias"):
        torch.testing.assert_close(result[name], deltas[0][name], rtol=1e-6, atol=0)


@pytest.mark.parametrize("scale", [1.0, 0.5, -2.0])
def test_apply_delta_matches_numpy(deltas: list[dict[str, torch.Tensor]], scale: float) -> None:
    g = torch.Generator().manual_seed(1)
    state = {
        "weight": torch.randn(3, 4, generator=g),
        "bias": torch.randn(4, generator=g),
        "num_batches_tracked": torch.tensor(100, dtype=torch.int64),
    }
    expected_state = {k: v.numpy().astype(np.float64) for k, v in state.items()}
    delta = weighted_average(deltas, WEIGHTS[0])
    live = {k: v for k, v in state.items()}  # same tensor objects: the update must be in place
    apply_delta(state, delta, scale=scale)

    for name in ("weight", "bias"):
        assert state[name] is live[name]
        want = expected_state[name] + scale * delta[name].numpy().astype(np.float64)
        np.testing.assert_allclose(state[name].numpy(), want, rtol=1e-6, atol=1e-6, err_msg=name)
    # The documented rule: an integer tensor advances by the rounded (scaled) weighted mean.
    counter = state["num_batches_tracked"]
    assert counter.dtype == torch.int64
    assert counter.item() == int(expected_state["num_batches_tracked"] + np.rint(scale * delta["num_batches_tracked"].item()))


def test_integer_counter_rounds_to_nearest_weighted_mean() -> None:
    """Clients tracked 10, 20 and 13 batches: weighted means 14.0, 13.25 and 15.75 advance the
    counter by 14, 13 and 16 (rounded, not truncated)."""
    counters = [torch.tensor(10), torch.tensor(20), torch.tensor(13)]
    for weights, mean in (([1, 1, 2], 14), ([2, 1, 1], 13), ([1, 2, 1], 16)):
        reference = np.rint(np.dot(weights, [10, 20, 13]) / sum(weights))
        state = {"n": torch.tensor(5, dtype=torch.int64)}
        apply_delta(state, weighted_average([{"n": c} for c in counters], weights))
        assert state["n"].item() == 5 + reference == 5 + mean


def test_apply_delta_casts_to_low_precision_target() -> None:
    state = {"w": torch.zeros(3, dtype=torch.bfloat16)}
    apply_delta(state, {"w": torch.tensor([1.0, 2.0, 4.0])}, scale=0.5)
    assert state["w"].dtype == torch.bfloat16
    assert state["w"].tolist() == [0.5, 1.0, 2.0]


@pytest.mark.parametrize("fn", [weighted_sum, weighted_average])
def test_length_mismatch(fn, deltas: list[dict[str, torch.Tensor]]) -> None:
    with pytest.raises(ValueError, match=r"Got 5 deltas but 3 weights\."):
        fn(deltas, [1.0, 2.0, 3.0])


def test_empty_deltas() -> None:
    with pytest.raises(ValueError, match=r"Cannot aggregate an empty list of deltas\."):
        weighted_sum([], [])


@pytest.mark.parametrize("weights", [[0, 0], [0.0, 0.0], [1.0, -1.0], [-1, -2]])
def test_weights_must_sum_to_a_positive_number(weights: list[float]) -> None:
    deltas = _random_deltas(2)
    with pytest.raises(ValueError, match=r"Aggregation weights must sum to a positive number, got \[.*\]\."):
        weighted_average(deltas, weights)


def test_empty_average_is_rejected() -> None:
    with pytest.raises(ValueError, match=r"Aggregation weights must sum to a positive number, got \[\]\."):
        weighted_average([], [])
