"""Ditto (Li et al. 2021) through FederatedTrainer against a plain-PyTorch Algorithm 1; its personalised
models in FederatedEvaluation; resume; composition with DP and robust rules; bad input."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import ModelCheckpoint

from fl_lightning import CoordinateMedian, Ditto, DPFedAvg, FedAvg, FederatedEvaluation, FederatedTrainer
from fl_lightning.algorithms import ClientContext
from fl_lightning.models import LogisticRegression

from ..integration.conftest import QUIET
from .feature_shift import CLASSES, FEATURES, NUM_CLIENTS, feature_shift_data, sgd_steps
from .quadratic import Quadratic, quadratic_data

LR, LAM, ROUNDS, LOCAL_STEPS, PERSONAL_STEPS, PER_ROUND = 0.05, 0.5, 3, 4, 3, 2


def fit(algorithm, *, rounds: int = ROUNDS, data=None, **kwargs):
    torch.manual_seed(0)
    model = LogisticRegression(in_features=FEATURES, num_classes=CLASSES, lr=LR)
    settings = {**QUIET, "precision": "64-true", "limit_val_batches": 0, "max_epochs": rounds,
                "local_steps": LOCAL_STEPS, "clients_per_round": PER_ROUND, "algorithm": algorithm}
    trainer = FederatedTrainer(**{**settings, **kwargs})
    trainer.fit(model, datamodule=data if data is not None else feature_shift_data())
    return model, trainer


def logistic_loss(params, x, y):
    return F.cross_entropy(x @ params["net.1.weight"].T + params["net.1.bias"], y)


def oracle(trainer) -> tuple[dict, dict]:
    """Algorithm 1 of Li et al. (2021) in plain PyTorch, on the rounds' selected clients and data order:
    w_k = FedAvg local SGD from w^t; v_k <- v_k - lr (grad F_k(v_k) + lam (v_k - w^t)) for s steps from
    v_k (w^0 at first); w^{t+1} = w^t + sum_k n_k (w_k - w^t) / sum_k n_k."""
    loop = trainer.fit_loop
    torch.manual_seed(0)
    start = LogisticRegression(in_features=FEATURES, num_classes=CLASSES).double()
    w = {k: v.detach().clone() for k, v in start.state_dict().items()}
    initial = {k: t.clone() for k, t in w.items()}
    personal: dict[int, dict] = {}
    for r, selected in enumerate(loop.history):
        deltas, sizes = [], []
        for cid in selected:
            client = loop.client_context(r, cid)
            local = sgd_steps(w, logistic_loss, loop.client_batches(client), LR)
            deltas.append({k: local[k] - w[k] for k in w})
            sizes.append(client.num_samples)
            personal_work = ClientContext(r, cid, client.num_samples, None, PERSONAL_STEPS, client.seed)
            centre = {k: t.clone() for k, t in w.items()}

            def personal_loss(v, x, y, centre=centre):
                return logistic_loss(v, x, y) + LAM / 2 * sum(((v[k] - centre[k]) ** 2).sum() for k in v)

            personal[cid] = sgd_steps(personal.get(cid, initial), personal_loss, loop.client_batches(personal_work), LR)
        total = sum(sizes)
        w = {k: w[k] + sum(n * d[k] for n, d in zip(sizes, deltas, strict=True)) / total for k in w}
    return w, personal


@pytest.mark.parametrize("executor", ["lightning", "lean"])
def test_matches_a_plain_pytorch_algorithm_1(executor):
    model, trainer = fit(Ditto(lam=LAM, personal_steps=PERSONAL_STEPS), client_executor=executor)
    history = trainer.fit_loop.history
    assert len(history) == ROUNDS and all(len(s) == PER_ROUND for s in history)
    assert len({c for s in history for c in s}) > PER_ROUND  # partial participation reaches other clients
    w, personal = oracle(trainer)
    for name, expected in w.items():
        torch.testing.assert_close(model.state_dict()[name], expected, rtol=0, atol=1e-6)
    store = trainer.algorithm.personal
    assert store.ids() == sorted(personal)
    for cid, expected in personal.items():
        for name, value in expected.items():
            torch.testing.assert_close(store.get(cid)[name], value, rtol=0, atol=1e-6)
        assert not torch.allclose(store.get(cid)["net.1.weight"], w["net.1.weight"])  # its own model


def test_the_lean_executor_gives_the_lightning_executors_weights_bit_for_bit():
    lean, lean_trainer = fit(Ditto(lam=LAM), client_executor="lean")
    full, full_trainer = fit(Ditto(lam=LAM), client_executor="lightning")
    assert torch.equal(lean.net[1].weight, full.net[1].weight)
    for cid, state in full_trainer.algorithm.personal.items():
        assert all(torch.equal(t, lean_trainer.algorithm.personal.get(cid)[k]) for k, t in state.items())


def test_the_global_model_is_fedavgs():
    ditto, _ = fit(Ditto(lam=LAM))
    fedavg, _ = fit(FedAvg())
    assert torch.equal(ditto.net[1].weight, fedavg.net[1].weight)


def test_personalised_models_are_evaluated_per_client():
    callback = FederatedEvaluation()
    data = feature_shift_data(holdout_fraction=0.25)
    _, trainer = fit(Ditto(lam=LAM), data=data, callbacks=[callback], precision="32-true")
    trained = trainer.algorithm.personal.ids()
    assert 0 < len(trained) <= NUM_CLIENTS
    metrics = trainer.callback_metrics
    assert float(metrics["clients/personal/count"]) == len(trained)
    assert "clients/personal/acc_mean" in metrics and "clients/personal/loss_mean" in metrics
    for r in callback.last_results:
        assert (r.personal_loss is None) == (r.client_id not in trained)
        if r.personal_loss is not None:
            assert r.personal_loss != pytest.approx(r.loss)  # scored with v_k, not the global model
    assert float(metrics["round/client_state_mib"]) == pytest.approx(trainer.algorithm.personal.nbytes() / 2**20)


def test_resume_equals_an_uninterrupted_run(tmp_path):
    def algorithm():
        return Ditto(lam=LAM, personal_steps=PERSONAL_STEPS)

    checkpoint = ModelCheckpoint(dirpath=tmp_path, every_n_epochs=1, save_top_k=-1, filename="{epoch}")
    # 32-bit: under precision="64-true" even FedAvg resumes only to ~5e-9 (a loop issue, not Ditto's)
    straight, trainer = fit(algorithm(), rounds=4, callbacks=[checkpoint], enable_checkpointing=True, precision="32-true")
    torch.manual_seed(1)  # a different initial model: w^0 and v_k^0 must come from the checkpoint
    resumed = LogisticRegression(in_features=FEATURES, num_classes=CLASSES, lr=LR)
    settings = {**QUIET, "limit_val_batches": 0, "max_epochs": 4,
                "local_steps": LOCAL_STEPS, "clients_per_round": PER_ROUND}
    again = FederatedTrainer(**settings, algorithm=algorithm())
    again.fit(resumed, datamodule=feature_shift_data(), ckpt_path=tmp_path / "epoch=1.ckpt")
    assert torch.equal(straight.net[1].weight, resumed.net[1].weight)
    assert trainer.algorithm.personal.ids() == again.algorithm.personal.ids()
    for cid, state in trainer.algorithm.personal.items():
        assert all(torch.equal(t, again.algorithm.personal.get(cid)[k]) for k, t in state.items())
    assert all(torch.equal(t, again.algorithm.initial[k]) for k, t in trainer.algorithm.initial.items())


def test_composes_with_dp_and_robust_aggregation_of_the_global_model():
    dp_model, dp = fit(DPFedAvg(noise_multiplier=0.5, clip_norm=1.0, algorithm=Ditto(lam=LAM)))
    assert float(dp.callback_metrics["round/dp_epsilon"]) > 0
    assert len(dp.algorithm.inner.personal) > 0
    median_model, robust = fit(CoordinateMedian(algorithm=Ditto(lam=LAM)))
    assert len(robust.algorithm.inner.personal) > 0
    plain, _ = fit(Ditto(lam=LAM))
    for other in (dp_model, median_model):
        assert not torch.equal(other.net[1].weight, plain.net[1].weight)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"lam": -0.1}, r"Ditto's `lam` \(lambda\) must be a finite number >= 0, got -0.1"),
        ({"lam": float("inf")}, r"Ditto's `lam` \(lambda\) must be a finite number >= 0, got inf"),
        ({"lam": "1"}, r"Ditto's `lam` \(lambda\) must be a finite number >= 0, got '1'"),
        ({"personal_steps": 0}, r"Ditto's `personal_steps` \(s\) must be an int >= 1 or None, got 0"),
        ({"personal_steps": 2.5}, r"Ditto's `personal_steps` \(s\) must be an int >= 1 or None, got 2.5"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Ditto(**kwargs)


def test_a_module_without_the_proximal_mixin_is_rejected():
    trainer = FederatedTrainer(**QUIET, max_epochs=1, local_steps=1, algorithm=Ditto())
    with pytest.raises(TypeError, match=r"Ditto needs a LightningModule that inherits `fl_lightning.ProximalMixin`"):
        trainer.fit(Quadratic(), datamodule=quadratic_data())

