"""FedPer (Arivazhagan et al. 2019) and LG-FedAvg (Liang et al. 2020) through FederatedTrainer against a plain-PyTorch
Algorithm 1 on a small MLP; per-client evaluation with each client's own layers; resume."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn

from fl_lightning import FederatedEvaluation, FederatedTrainer, FedPer, LGFedAvg
from fl_lightning.models.classifier import ClassificationModule

from ..integration.conftest import QUIET
from .feature_shift import CLASSES, FEATURES, feature_shift_data, sgd_steps

LR, ROUNDS, LOCAL_STEPS, PER_ROUND, HIDDEN = 0.1, 3, 4, 2, 6
BASE = ("net.base.weight", "net.base.bias")
HEAD = ("net.head.weight", "net.head.bias")


class TwoLayer(ClassificationModule):
    """base: Linear -> ReLU; head: Linear."""

    def __init__(self, **kwargs) -> None:
        super().__init__(num_classes=CLASSES, **kwargs)
        self.net = nn.Sequential()
        self.net.add_module("base", nn.Linear(FEATURES, HIDDEN))
        self.net.add_module("relu", nn.ReLU())
        self.net.add_module("head", nn.Linear(HIDDEN, CLASSES))


def new_model(seed: int = 0) -> TwoLayer:
    torch.manual_seed(seed)
    return TwoLayer(lr=LR)


def fit(algorithm, *, model=None, data=None, ckpt_path=None, **kwargs):
    model = model if model is not None else new_model()
    settings = {"precision": "64-true", "limit_val_batches": 0, "max_epochs": ROUNDS, "local_steps": LOCAL_STEPS}
    trainer = FederatedTrainer(**{**QUIET, **settings, "clients_per_round": PER_ROUND, "algorithm": algorithm, **kwargs})
    trainer.fit(model, datamodule=data if data is not None else feature_shift_data(), ckpt_path=ckpt_path)
    return model, trainer


def loss(p, x, y):
    return F.cross_entropy(F.linear(F.linear(x, p[BASE[0]], p[BASE[1]]).relu(), p[HEAD[0]], p[HEAD[1]]), y)


def oracle(trainer, initial: dict, local: tuple[str, ...]) -> tuple[dict, dict]:
    """Algorithm 1 of both papers in plain PyTorch on the rounds' selected clients and data order: each client
    trains the global shared layers with its own ``local`` layers (the initial ones at first), keeps those, and
    the server averages the shared layers weighted by samples (FedPer's W_B <- sum_j n_j / n W_B,j)."""
    loop = trainer.fit_loop
    shared = [k for k in (*BASE, *HEAD) if k not in local]
    w = {k: initial[k].clone() for k in shared}
    own: dict[int, dict] = {}
    for r, selected in enumerate(loop.history):
        deltas, sizes = [], []
        for cid in selected:
            client = loop.client_context(r, cid)
            start = {**w, **own.get(cid, {k: initial[k] for k in local})}
            trained = sgd_steps(start, loss, loop.client_batches(client), LR)
            own[cid] = {k: trained[k] for k in local}
            deltas.append({k: trained[k] - w[k] for k in shared})
            sizes.append(client.num_samples)
        w = {k: w[k] + sum(n * d[k] for n, d in zip(sizes, deltas, strict=True)) / sum(sizes) for k in w}
    return w, own


ALGORITHMS = {"FedPer": (lambda: FedPer(personal=["net.head"]), HEAD), "LGFedAvg": (lambda: LGFedAvg(local=["net.base"]), BASE)}


@pytest.mark.parametrize("executor", ["lightning", "lean"])
@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_matches_a_plain_pytorch_algorithm_1(name, executor):
    make_algorithm, local = ALGORITHMS[name]
    model = new_model()
    initial = {k: v.detach().double().clone() for k, v in model.state_dict().items()}
    model, trainer = fit(make_algorithm(), model=model, client_executor=executor)
    assert len({c for s in trainer.fit_loop.history for c in s}) > PER_ROUND  # partial participation
    assert trainer.fit_loop.kinds.local == local
    w, own = oracle(trainer, initial, local)
    state = model.state_dict()
    for name_, expected in w.items():
        assert not torch.equal(state[name_], initial[name_])
        torch.testing.assert_close(state[name_], expected, rtol=0, atol=1e-6)
    for name_ in local:  # the global model keeps the initial local layers
        assert torch.equal(state[name_], initial[name_])
    store = trainer.algorithm.personal
    assert store.ids() == sorted(own)
    for cid, expected in own.items():
        assert set(store.get(cid)) == set(local)
        for name_, value in expected.items():
            torch.testing.assert_close(store.get(cid)[name_], value, rtol=0, atol=1e-6)
    # the upload is the shared layers' delta only (float64 under "64-true")
    shared_bytes = sum(initial[k].numel() for k in w) * 8
    assert float(trainer.callback_metrics["round/upload_bytes"]) == PER_ROUND * shared_bytes


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_clients_are_evaluated_with_their_own_layers(name):
    make_algorithm, local = ALGORITHMS[name]
    callback = FederatedEvaluation()
    model, trainer = fit(make_algorithm(), data=feature_shift_data(holdout_fraction=1 / 3), callbacks=[callback], precision="32-true")
    trained = trainer.algorithm.personal.ids()
    assert float(trainer.callback_metrics["clients/personal/count"]) == len(trained) > 0
    assert "clients/personal/acc_mean" in trainer.callback_metrics and "clients/personal/loss_mean" in trainer.callback_metrics
    data = trainer.datamodule
    for r in callback.last_results:
        if r.client_id not in trained:
            assert r.personal_loss is None
            continue
        own = TwoLayer(lr=LR)  # by hand: the global model with the client's own layers, on its held-out data
        own.load_state_dict({**model.state_dict(), **trainer.algorithm.personalized_state(r.client_id)})
        x, y = (torch.cat(parts) for parts in zip(*data.holdout_dataloader(r.client_id), strict=True))
        with torch.no_grad():
            assert r.personal_loss == pytest.approx(float(F.cross_entropy(own(x), y)), rel=1e-5)
        assert r.personal_loss != pytest.approx(r.loss)


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_resume_equals_an_uninterrupted_run(tmp_path, name):
    make_algorithm, _ = ALGORITHMS[name]
    checkpoint = ModelCheckpoint(dirpath=tmp_path, every_n_epochs=1, save_top_k=-1, filename="{epoch}")
    run = {"max_epochs": 4, "precision": "32-true"}
    straight, trainer = fit(make_algorithm(), callbacks=[checkpoint], enable_checkpointing=True, **run)
    resumed, again = fit(make_algorithm(), model=new_model(seed=1), ckpt_path=tmp_path / "epoch=1.ckpt", **run)
    assert all(torch.equal(t, resumed.state_dict()[k]) for k, t in straight.state_dict().items())
    assert trainer.algorithm.personal.ids() == again.algorithm.personal.ids()
    for cid, state in trainer.algorithm.personal.items():
        assert all(torch.equal(t, again.algorithm.personal.get(cid)[k]) for k, t in state.items())


def test_fedper_needs_a_personal_layer():
    with pytest.raises(ValueError, match=r"FedPer needs at least one pattern in `local`, got \[\]"):
        FedPer(personal=[])
    with pytest.raises(ValueError, match=r"FedPer keeps local tensors by 'classifier', which matches no tensor of TwoLayer"):
        fit(FedPer(personal=["classifier"]))
