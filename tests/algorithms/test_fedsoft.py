"""FedSoft through the federated loop: oracle importance, selection, aggregation, state, resume, errors."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from fl_lightning import FedAvg, FederatedCallback, FederatedTrainer, FedSoft
from fl_lightning.algorithms.shared.cluster_math import average_states
from fl_lightning.data import FederatedDataModule, Natural, SyntheticRegressionMixture
from fl_lightning.models import LinearRegression

from ..checkpoint_files import load_checkpoint_file
from ..integration.conftest import QUIET
from .quadratic import Quadratic, quadratic_data

N = 8


def mixture_data(*, pattern: str = "10:90", noise_std: float = 1.0, holdout: float = 0.25, seed: int = 0) -> FederatedDataModule:
    kwargs: dict[str, Any] = {"num_clients": N, "pattern": pattern, "noise_std": noise_std, "samples_per_client": (20, 30), "seed": seed}
    return FederatedDataModule(
        SyntheticRegressionMixture(**kwargs),
        SyntheticRegressionMixture(**kwargs, split="test", test_samples_per_source=100),
        partitioner=Natural(),
        num_clients=N,
        batch_size=10,
        holdout_fraction=holdout,
    )


def fit(algorithm, *, rounds: int = 2, data=None, optimizer: str = "adam", lr: float = 0.05, **kwargs):
    torch.manual_seed(0)
    model = LinearRegression(lr=lr, optimizer=optimizer)
    trainer = FederatedTrainer(**{**QUIET, "max_epochs": rounds, "local_epochs": 1, "limit_val_batches": 0, "algorithm": algorithm, **kwargs})
    trainer.fit(model, datamodule=data if data is not None else mixture_data())
    return model, trainer


def oracle_centres(data: FederatedDataModule) -> list[dict[str, torch.Tensor]]:
    return [{"net.weight": theta[None, :].clone()} for theta in data.train.thetas]


def true_u(data: FederatedDataModule) -> torch.Tensor:
    rows = [torch.bincount(torch.from_numpy(data.train.source_ids[data.client_indices(c)]), minlength=2) for c in range(N)]
    counts = torch.stack(rows).double()
    return counts / counts.sum(dim=1, keepdim=True)


# --- importance ---------------------------------------------------------------------------------


@pytest.mark.parametrize("pattern", ["10:90", "random"])
def test_noise_free_oracle_centres_give_the_true_mixture_exactly(pattern):
    data = mixture_data(pattern=pattern, noise_std=0.0)
    sigma = 1e-3
    _, trainer = fit(FedSoft(num_clusters=2, clients_per_cluster=4, sigma=sigma, tau=10, centres=oracle_centres(data)), rounds=1, data=data)
    assert torch.equal(trainer.algorithm.u, true_u(data).clamp_min(sigma))
    assert trainer.callback_metrics["round/u_error"] < 1e-3  # up to the sigma floor


def test_importance_is_re_estimated_every_tau_rounds():
    seen = []

    class Spy(FedSoft):
        def estimate_importance(self):
            seen.append(len(self.selection_history))
            return super().estimate_importance()

    fit(Spy(num_clusters=2, clients_per_cluster=3, tau=2), rounds=5)
    assert seen == [0, 2, 4]


# --- selection and aggregation -------------------------------------------------------------------


def test_each_selected_client_trains_once_and_centres_average_their_selected_models():
    algorithm = FedSoft(num_clusters=2, clients_per_cluster=5)
    _, trainer = fit(algorithm, rounds=1)
    (selected,) = algorithm.selection_history
    assert all(len(sel) == 5 == len(set(sel)) for sel in selected)
    union = sorted(set(selected[0]) | set(selected[1]))
    assert trainer.fit_loop.history == [union]  # the loop trains each client once
    assert len(union) < 10  # some clients were drawn by both clusters
    assert algorithm.models.ids() == union
    for s, sel in enumerate(selected):
        expected = average_states([algorithm.models.get(c) for c in sel])
        for name, value in algorithm.centres[s].items():
            torch.testing.assert_close(value, expected[name], rtol=0, atol=0)


def test_global_model_is_centre_zero_and_state_lives_on_the_cpu():
    algorithm = FedSoft(num_clusters=2, clients_per_cluster=4, persist_optimizer_state=True)
    model, _ = fit(algorithm, rounds=2)
    assert torch.equal(model.net.weight.detach(), algorithm.centres[0]["net.weight"])
    tensors = [t for _, m in algorithm.models.items() for t in m.values()] + [t for c in algorithm.centres for t in c.values()]
    tensors += [t for _, s in algorithm.optimizer_states.items() for t in s.values()]
    assert tensors and all(t.device.type == "cpu" for t in tensors) and algorithm.u.device.type == "cpu"


def test_selection_is_deterministic_from_the_seed():
    def history(seed: int) -> list:
        algorithm = FedSoft(num_clusters=2, clients_per_cluster=3)
        fit(algorithm, rounds=3, seed=seed)
        return algorithm.selection_history

    assert history(0) == history(0)
    assert history(0) != history(1)


def test_one_cluster_without_proximal_term_is_uniform_fedavg_in_the_first_round():
    soft, _ = fit(FedSoft(num_clusters=1, clients_per_cluster=N, lam=0.0, sigma=1.0), rounds=1, optimizer="sgd")
    avg, _ = fit(FedAvg(weighting="uniform"), rounds=1, optimizer="sgd")
    torch.testing.assert_close(soft.net.weight, avg.net.weight, rtol=0, atol=1e-6)


@pytest.mark.parametrize("lam", [0.0, 1.0])
def test_local_models_match_plain_gradient_descent_on_eq_4_with_the_proximal_term(lam):
    """w_k after one round equals full-batch GD on h_k (eq. 4), MSE + lambda/2 sum_s u_ks ||w - c_s||^2.

    LinearRegression once defined its own training_step beside ProximalMixin, so lambda changed nothing on
    the synthetic benchmark's model; the reference below is plain PyTorch, and the other lambda's
    reference is far from the result, so an inert (or wrongly scaled) proximal term fails."""
    data = FederatedDataModule(
        SyntheticRegressionMixture(num_clients=N, noise_std=0.0, samples_per_client=(20, 30), seed=0),
        partitioner=Natural(),
        num_clients=N,
        batch_size=64,  # one full batch per epoch: the steps do not depend on the batch order
    )
    sigma, lr, steps = 1e-3, 0.05, 3
    algorithm = FedSoft(num_clusters=2, clients_per_cluster=N, lam=lam, sigma=sigma, centres=oracle_centres(data))
    fit(algorithm, rounds=1, data=data, optimizer="sgd", lr=lr, local_epochs=steps)
    u = true_u(data).clamp_min(sigma)  # noise-free data and the true centres: the importance is known exactly
    thetas = data.train.thetas[:, None, :]  # [S, 1, d], as net.weight
    x, y = data.train.tensors

    def reference(cid: int, lam_: float) -> torch.Tensor:
        idx = torch.as_tensor(list(data.client_indices(cid)))
        w = algorithm.initial["net.weight"].clone().requires_grad_(True)
        for _ in range(steps):
            loss = ((x[idx] @ w.T - y[idx]) ** 2).mean() + lam_ / 2 * sum(u[cid, s] * ((w - thetas[s]) ** 2).sum() for s in range(2))
            (grad,) = torch.autograd.grad(loss, w)
            w = (w - lr * grad).detach().requires_grad_(True)
        return w.detach()

    for cid in range(N):
        got = algorithm.models.get(cid)["net.weight"]
        torch.testing.assert_close(got, reference(cid, lam).to(got.dtype), rtol=1e-4, atol=1e-5)
        assert (got - reference(cid, 1.0 - lam).to(got.dtype)).abs().max() > 1e-2


class OptimizerSpy(FederatedCallback):
    """Reads the optimizer state and weights a client starts from, after the loop's reset and configure_client."""

    def __init__(self) -> None:
        self.steps: dict[int, list[int]] = {}
        self.weights: dict[int, list[torch.Tensor]] = {}

    def on_client_start(self, trainer, pl_module, client) -> None:
        state = trainer.optimizers[0].state
        self.steps.setdefault(client.client_id, []).append(int(next(iter(state.values()))["step"]) if state else 0)
        self.weights.setdefault(client.client_id, []).append(pl_module.net.weight.detach().clone())


@pytest.mark.parametrize("persist", [True, False])
def test_clients_train_from_their_own_model_with_optional_persistent_optimizer_state(persist):
    spy = OptimizerSpy()
    algorithm = FedSoft(num_clusters=2, clients_per_cluster=N, persist_optimizer_state=persist)
    fit(algorithm, rounds=3, callbacks=[spy])
    for cid, steps in spy.steps.items():
        # every client trains every round (K = N); with the flag Adam's step count carries over
        assert steps == ([0, steps[1], 2 * steps[1]] if persist else [0, 0, 0]) and (steps[1] > 0 or not persist), steps
        assert torch.equal(spy.weights[cid][0], algorithm.initial["net.weight"])  # the common initial model
        assert not torch.equal(spy.weights[cid][1], spy.weights[cid][0])  # then its own model
    assert len({tuple(w[1].flatten().tolist()) for w in spy.weights.values()}) == N  # one per client


def test_metrics_of_every_centre_and_personalised_models():
    _, trainer = fit(FedSoft(num_clusters=2, clients_per_cluster=4, evaluate_sources=True), rounds=2)
    metrics = trainer.callback_metrics
    for key in ("src0_c0_loss", "src1_c1_loss", "src0_best_centre", "u_error", "c0_source", "personal_train_loss",
                "personal_heldout_loss", "personal_clients", "distinct_clients", "estimated", "u_mean_c0"):
        assert f"round/{key}" in metrics, key


# --- state ---------------------------------------------------------------------------------------


def assert_same_state(a: Any, b: Any) -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    elif isinstance(a, dict):
        keys = a.keys() - {"revisions"}  # a client store's revisions name its entries' versions in one process, not values
        assert keys == b.keys() - {"revisions"}
        for key in keys:
            assert_same_state(a[key], b[key])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same_state(x, y)
    else:
        assert a == b


def test_resume_restores_per_client_state_exactly_and_gives_the_same_weights(tmp_path):
    def algorithm():
        return FedSoft(num_clusters=2, clients_per_cluster=4, tau=2, persist_optimizer_state=True)

    checkpoint = ModelCheckpoint(dirpath=tmp_path, every_n_epochs=1, save_top_k=-1, filename="{epoch}")
    straight, trainer = fit(algorithm(), rounds=4, callbacks=[checkpoint], enable_checkpointing=True)
    saved = load_checkpoint_file(tmp_path / "epoch=2.ckpt")["loops"]["fit_loop"]["state_dict"]["federated"]["algorithm"]
    fresh = algorithm()
    fresh.load_state_dict(saved)
    assert_same_state(fresh.state_dict(), saved)
    assert len(saved["optimizer_states"]["entries"]) > 0

    torch.manual_seed(0)
    resumed = LinearRegression(lr=0.05)
    again = FederatedTrainer(**{**QUIET, "max_epochs": 4, "local_epochs": 1, "limit_val_batches": 0, "algorithm": algorithm()})
    again.fit(resumed, datamodule=mixture_data(), ckpt_path=tmp_path / "epoch=1.ckpt")  # resumes at round 2 (not a tau round)
    assert torch.equal(straight.net.weight, resumed.net.weight)
    assert_same_state(trainer.algorithm.state_dict(), again.algorithm.state_dict())


def _resume_from(checkpoint, algorithm: FedSoft, rounds: int, **kwargs: Any) -> LinearRegression:
    torch.manual_seed(0)
    resumed = LinearRegression(lr=0.05)
    settings = {**QUIET, "max_epochs": rounds, "local_epochs": 1, "limit_val_batches": 0, "algorithm": algorithm, **kwargs}
    FederatedTrainer(**settings).fit(resumed, datamodule=mixture_data(), ckpt_path=checkpoint)
    return resumed


def _persisting() -> FedSoft:
    return FedSoft(num_clusters=2, clients_per_cluster=4, tau=2, persist_optimizer_state=True)


def test_client_state_spilled_to_disk_checkpoints_and_resumes_bit_exactly(tmp_path):
    straight, _ = fit(_persisting(), rounds=4)  # no memory limit: nothing spills
    checkpoint = ModelCheckpoint(dirpath=tmp_path, every_n_epochs=1, save_top_k=-1, filename="{epoch}")
    _, spilling = fit(_persisting(), rounds=2, callbacks=[checkpoint], enable_checkpointing=True, client_state_memory=0)
    models, optimizer_states = spilling.algorithm.models, spilling.algorithm.optimizer_states
    assert len(models) > 0 and models.resident_nbytes() == 0 and optimizer_states.resident_nbytes() == 0
    resumed = _resume_from(tmp_path / "epoch=1.ckpt", _persisting(), 4, client_state_memory="1kB")
    assert torch.equal(straight.net.weight, resumed.net.weight)


def test_a_checkpoint_from_before_the_client_store_is_converted_and_resumes_the_same(tmp_path):
    checkpoint = ModelCheckpoint(dirpath=tmp_path, every_n_epochs=1, save_top_k=-1, filename="{epoch}")
    straight, _ = fit(_persisting(), rounds=4, callbacks=[checkpoint], enable_checkpointing=True)
    saved = load_checkpoint_file(tmp_path / "epoch=1.ckpt")
    algorithm = saved["loops"]["fit_loop"]["state_dict"]["federated"]["algorithm"]
    models, optimizers = algorithm.pop("models")["entries"], algorithm.pop("optimizer_states")["entries"]
    # ClientStates' layout: whole models, and per client one {parameter index: {key: value}} per optimizer.
    algorithm["clients"] = {
        "models": models,
        "optimizers": {
            cid: [{int(name.split(".")[1]): {} for name in flat if name.count(".") == 2}] for cid, flat in optimizers.items()
        },
    }
    for cid, flat in optimizers.items():
        for name, value in flat.items():
            if name.count(".") == 2:
                _, index, key = name.split(".")
                algorithm["clients"]["optimizers"][cid][0][int(index)][key] = value
    torch.save(saved, tmp_path / "old.ckpt")
    resumed = _resume_from(tmp_path / "old.ckpt", _persisting(), 4)
    assert torch.equal(straight.net.weight, resumed.net.weight)


# --- bad input -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_clusters": 0}, r"number of clusters S \(`num_clusters`\) must be an int >= 1, got 0"),
        ({"tau": 0}, r"`tau` must be an int >= 1, got 0"),
        ({"sigma": 0.0}, r"`sigma` must be in \(0, 1/S\] = \(0, 0.5\] for S=2, got 0.0"),
        ({"sigma": 0.6}, r"`sigma` must be in \(0, 1/S\] = \(0, 0.5\] for S=2, got 0.6"),
        ({"num_clusters": 4, "sigma": 0.3}, r"\(0, 0.25\] for S=4, got 0.3"),
        ({"lam": -1.0}, r"`lam` must be a finite number >= 0, got -1.0"),
        ({"clients_per_cluster": 0}, r"`clients_per_cluster` \(K\) must be an int >= 1, got 0"),
    ],
)
def test_bad_constructor_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        FedSoft(**kwargs)


def test_more_clients_per_cluster_than_clients_fails_before_training():
    with pytest.raises(ValueError, match=r"K=9 clients per cluster but there are only 8 clients: set `clients_per_cluster` <= 8"):
        fit(FedSoft(clients_per_cluster=9), rounds=1)


def test_a_module_without_the_proximal_mixin_is_rejected():
    trainer = FederatedTrainer(**{**QUIET, "max_epochs": 1, "local_steps": 1, "algorithm": FedSoft(clients_per_cluster=2)})
    with pytest.raises(TypeError, match=r"inherits `fl_lightning.ProximalMixin`.*class MyModel\(ProximalMixin, Quadratic\)"):
        trainer.fit(Quadratic(), datamodule=quadratic_data())


def test_per_source_test_metrics_are_opt_in():
    """Without ``evaluate_sources`` the centres are never scored on the test set during fit."""
    _, trainer = fit(FedSoft(num_clusters=2, clients_per_cluster=4), rounds=1)
    assert not any(key.startswith("round/src") for key in trainer.callback_metrics)


