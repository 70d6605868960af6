"""Server optimizers against hand-unrolled Reddi et al. 2021 (Algorithm 2) / Hsu et al. 2019 updates."""

from __future__ import annotations

import io
import math

import numpy as np
import pytest
import torch

from fl_lightning.algorithms.shared.server_optimizers import ServerAdagrad, ServerAdam, ServerOptimizer, ServerSGD, ServerYogi

PARAMS = frozenset({"w"})
X0 = [0.5, -1.0, 2.0]
# One aggregated delta per round; the second coordinate changes sign to exercise Yogi's sign().
DELTAS = [[0.1, -0.2, 0.0], [0.3, 0.4, -0.07], [-0.2, 0.1, 0.02]]


def _state() -> dict[str, torch.Tensor]:
    return {"w": torch.tensor(X0), "running_mean": torch.tensor([1.0, 2.0]), "count": torch.tensor(7)}


def _delta(values: list[float]) -> dict[str, torch.Tensor]:
    return {"w": torch.tensor(values), "running_mean": torch.tensor([0.25, -0.5]), "count": torch.tensor(3)}


def _run(opt: ServerOptimizer, rounds: int = 3) -> dict[str, torch.Tensor]:
    state = _state()
    for values in DELTAS[:rounds]:
        opt.step(state, _delta(values), PARAMS)
    return state


def test_sgd_defaults_are_exactly_global_plus_delta() -> None:
    g = torch.Generator().manual_seed(0)
    state = {"a": torch.randn(17, generator=g), "b": torch.randn(2, 3, generator=g), "n": torch.tensor(4)}
    delta = {"a": torch.randn(17, generator=g), "b": torch.randn(2, 3, generator=g), "n": torch.tensor(2.0)}
    expected = {"a": state["a"] + delta["a"], "b": state["b"] + delta["b"], "n": torch.tensor(6)}
    ServerSGD(lr=1, momentum=0).step(state, delta, frozenset({"a", "b"}))
    for name in state:
        assert torch.equal(state[name], expected[name]), name


def test_sgd_keeps_no_state_without_momentum() -> None:
    opt = ServerSGD(lr=0.5)
    _run(opt)
    assert opt.state_dict() == {}


def test_fedavgm_matches_hand_unrolled_three_rounds() -> None:
    lr, beta = 0.7, 0.9
    state = _run(ServerSGD(lr=lr, momentum=beta))
    x = np.array(X0, dtype=np.float64)
    d0, d1, d2 = (np.array(d, dtype=np.float64) for d in DELTAS)
    v0 = d0
    v1 = beta * v0 + d1
    v2 = beta * v1 + d2
    expected = x + lr * v0 + lr * v1 + lr * v2
    np.testing.assert_allclose(state["w"].numpy(), expected, rtol=1e-6, atol=1e-7)


def _adaptive_reference(kind: str, *, lr: float, beta1: float, beta2: float, tau: float, rounds: int) -> np.ndarray:
    """Reddi et al. 2021, Algorithm 2, coordinate by coordinate in plain Python floats."""
    out = []
    for i, x in enumerate(X0):
        m, v = 0.0, tau**2
        for t in range(rounds):
            d = DELTAS[t][i]
            m = beta1 * m + (1 - beta1) * d
            if kind == "adagrad":
                v = v + d * d
            elif kind == "adam":
                v = beta2 * v + (1 - beta2) * d * d
            else:  # yogi
                diff = v - d * d
                sign = (diff > 0) - (diff < 0)
                v = v - (1 - beta2) * d * d * sign
            x = x + lr * m / (math.sqrt(v) + tau)
        out.append(x)
    return np.array(out)


ADAPTIVE = [("adagrad", ServerAdagrad), ("adam", ServerAdam), ("yogi", ServerYogi)]


@pytest.mark.parametrize(("kind", "cls"), ADAPTIVE)
@pytest.mark.parametrize("rounds", [1, 2, 3])
def test_adaptive_matches_hand_computation(kind: str, cls: type[ServerOptimizer], rounds: int) -> None:
    hp = {"lr": 0.1, "beta1": 0.8, "beta2": 0.95, "tau": 0.05}
    state = _run(cls(**hp), rounds)
    expected = _adaptive_reference(kind, rounds=rounds, **hp)
    np.testing.assert_allclose(state["w"].numpy(), expected, rtol=1e-5, atol=1e-6)


def test_adam_first_round_by_hand() -> None:
    """One scalar round written out: m = 0.1 * 0.2 = 0.02, v = 0.99 * 0.01**2 + 0.01 * 0.04 = 0.000499."""
    x = {"w": torch.tensor([1.0])}
    ServerAdam(lr=0.5, beta1=0.9, beta2=0.99, tau=0.01).step(x, {"w": torch.tensor([0.2])}, PARAMS)
    expected = 1.0 + 0.5 * 0.02 / (math.sqrt(0.000499) + 0.01)
    assert x["w"].item() == pytest.approx(expected, rel=1e-6)


def test_adaptive_defaults_follow_the_paper_grid() -> None:
    opt = ServerAdam()
    assert (opt.lr, opt.beta1, opt.beta2, opt.tau) == (1e-2, 0.9, 0.99, 1e-3)


def test_yogi_and_adam_differ_where_the_second_moment_shrinks() -> None:
    # Guards the reference itself: with these deltas Yogi's additive update must not equal Adam's.
    adam, yogi = _run(ServerAdam(lr=0.1, tau=0.05)), _run(ServerYogi(lr=0.1, tau=0.05))
    assert not torch.allclose(adam["w"], yogi["w"])


@pytest.mark.parametrize(
    "opt",
    [ServerSGD(lr=0.5, momentum=0.9), ServerAdagrad(lr=0.1), ServerAdam(lr=0.1), ServerYogi(lr=0.1)],
    ids=["sgd_momentum", "adagrad", "adam", "yogi"],
)
def test_buffers_get_the_plain_delta(opt: ServerOptimizer) -> None:
    state = _run(opt)
    # Three rounds of running_mean += [0.25, -0.5] and count += 3, untouched by lr/momentum/adaptivity.
    assert torch.equal(state["running_mean"], torch.tensor([1.75, 0.5]))
    assert state["count"].dtype == torch.int64 and state["count"].item() == 16
    assert all("running_mean" not in slot and "count" not in slot for slot in opt.state.values())


@pytest.mark.parametrize(
    "factory",
    [
        lambda: ServerSGD(lr=0.5, momentum=0.9),
        lambda: ServerAdagrad(lr=0.1),
        lambda: ServerAdam(lr=0.1),
        lambda: ServerYogi(lr=0.1),
    ],
    ids=["sgd_momentum", "adagrad", "adam", "yogi"],
)
def test_state_dict_round_trip_continues_identically(factory) -> None:
    reference, first = factory(), factory()
    state_ref, state_first = _state(), _state()
    for values in DELTAS[:2]:
        reference.step(state_ref, _delta(values), PARAMS)
        first.step(state_first, _delta(values), PARAMS)

    buffer = io.BytesIO()
    torch.save(first.state_dict(), buffer)
    buffer.seek(0)
    resumed = factory()
    resumed.load_state_dict(torch.load(buffer))
    assert resumed.state.keys() == reference.state.keys() and resumed.state

    reference.step(state_ref, _delta(DELTAS[2]), PARAMS)
    resumed.step(state_first, _delta(DELTAS[2]), PARAMS)
    assert torch.equal(state_ref["w"], state_first["w"])


def test_state_dict_is_a_snapshot() -> None:
    opt = ServerAdam(lr=0.1)
    _run(opt, rounds=1)
    saved = opt.state_dict()
    m_before = saved["m"]["w"].clone()
    opt.step(_state(), _delta(DELTAS[1]), PARAMS)
    assert torch.equal(saved["m"]["w"], m_before)
    assert not torch.equal(opt.state["m"]["w"], m_before)


@pytest.mark.parametrize(
    ("factory", "match"),
    [
        (lambda: ServerSGD(lr=0), r"`lr` must be a finite number > 0, got 0\."),
        (lambda: ServerSGD(lr=-0.5), r"`lr` must be a finite number > 0, got -0\.5\."),
        (lambda: ServerSGD(momentum=1.0), r"`momentum` must be in \[0, 1\), got 1\.0\."),
        (lambda: ServerSGD(momentum=-0.1), r"`momentum` must be in \[0, 1\), got -0\.1\."),
        (lambda: ServerAdam(lr=-1), r"`lr` must be a finite number > 0, got -1\."),
        (lambda: ServerAdam(beta1=1.5), r"`beta1` must be in \[0, 1\), got 1\.5\."),
        (lambda: ServerYogi(beta2=1.0), r"`beta2` must be in \[0, 1\), got 1\.0\."),
        (lambda: ServerAdagrad(tau=0), r"`tau` must be a finite number > 0, got 0\."),
        (lambda: ServerAdam(tau=-1e-3), r"`tau` must be a finite number > 0, got -0\.001\."),
    ],
)
def test_bad_hyper_parameters(factory, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        factory()


def test_constructors_are_keyword_only() -> None:
    with pytest.raises(TypeError):
        ServerSGD(0.1)  # type: ignore[misc]
    with pytest.raises(TypeError):
        ServerAdam(0.1)  # type: ignore[misc]
