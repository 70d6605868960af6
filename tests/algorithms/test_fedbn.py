"""FedBN (Li et al. 2021) through FederatedTrainer against a plain-PyTorch Algorithm 1 on a small BatchNorm
network; per-client evaluation with each client's own BatchNorm; resume; DP and robust composition; refusals."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn

from fl_lightning import CoordinateMedian, DPFedAvg, FedBN, FederatedEvaluation, FederatedTrainer
from fl_lightning.models import LogisticRegression
from fl_lightning.models.classifier import ClassificationModule

from ..integration.conftest import QUIET
from ..test_federation import federation
from .feature_shift import CLASSES, FEATURES, feature_shift_data, sgd_steps

LR, ROUNDS, LOCAL_STEPS, PER_ROUND, HIDDEN = 0.1, 3, 4, 2, 6
BN = ("net.1.weight", "net.1.bias", "net.1.running_mean", "net.1.running_var", "net.1.num_batches_tracked")
SHARED = ("net.0.weight", "net.0.bias", "net.3.weight", "net.3.bias")
#: The shared tensors training moves: BatchNorm cancels the gradient of the bias before it.
MOVED = ("net.0.weight", "net.3.weight", "net.3.bias")


class BatchNormMLP(ClassificationModule):
    """Linear -> BatchNorm1d -> ReLU -> Linear."""

    def __init__(self, **kwargs) -> None:
        super().__init__(num_classes=CLASSES, **kwargs)
        self.net = nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.BatchNorm1d(HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, CLASSES))


def new_model(seed: int = 0) -> BatchNormMLP:
    torch.manual_seed(seed)
    return BatchNormMLP(lr=LR)


def settings(**kwargs):
    return {**QUIET, "precision": "64-true", "limit_val_batches": 0, "max_epochs": ROUNDS,
            "local_steps": LOCAL_STEPS, "clients_per_round": PER_ROUND, **kwargs}


def fit(algorithm, *, data=None, model=None, **kwargs):
    model = model if model is not None else new_model()
    trainer = FederatedTrainer(**settings(algorithm=algorithm, **kwargs))
    trainer.fit(model, datamodule=data if data is not None else feature_shift_data())
    return model, trainer


def oracle(trainer, initial: dict) -> tuple[dict, dict]:
    """FedBN's Algorithm 1 in plain PyTorch on the rounds' selected clients and data order: each client
    trains the global non-BN layers with its own BN layers (the initial ones at first), keeps its BN
    (affine and running statistics), and the server averages the non-BN layers sample-weighted."""
    loop = trainer.fit_loop
    w = {k: initial[k].clone() for k in SHARED}
    own: dict[int, dict] = {}
    for r, selected in enumerate(loop.history):
        deltas, sizes = [], []
        for cid in selected:
            bn = {k: t.clone() for k, t in own.get(cid, {k: initial[k] for k in BN}).items()}

            def loss(p, x, y, bn=bn):
                h = F.linear(x, p["net.0.weight"], p["net.0.bias"])
                mean, var = bn["net.1.running_mean"], bn["net.1.running_var"]  # updated in place
                h = F.batch_norm(h, mean, var, p["net.1.weight"], p["net.1.bias"], training=True)
                bn["net.1.num_batches_tracked"] += 1
                return F.cross_entropy(F.linear(h.relu(), p["net.3.weight"], p["net.3.bias"]), y)

            client = loop.client_context(r, cid)
            start = {**w, "net.1.weight": bn["net.1.weight"], "net.1.bias": bn["net.1.bias"]}
            trained = sgd_steps(start, loss, loop.client_batches(client), LR)
            own[cid] = {**bn, "net.1.weight": trained["net.1.weight"], "net.1.bias": trained["net.1.bias"]}
            deltas.append({k: trained[k] - w[k] for k in SHARED})
            sizes.append(client.num_samples)
        w = {k: w[k] + sum(n * d[k] for n, d in zip(sizes, deltas, strict=True)) / sum(sizes) for k in w}
    return w, own


@pytest.mark.parametrize("executor", ["lightning", "lean"])
def test_matches_a_plain_pytorch_algorithm_1(executor):
    model = new_model()
    initial = {k: v.detach().double().clone() for k, v in model.state_dict().items()}
    model, trainer = fit(FedBN(), model=model, client_executor=executor)
    assert len({c for s in trainer.fit_loop.history for c in s}) > PER_ROUND  # partial participation
    w, own = oracle(trainer, initial)
    state = model.state_dict()
    for name, expected in w.items():
        torch.testing.assert_close(state[name], expected, rtol=0, atol=1e-6)
    assert all(not torch.equal(state[k], initial[k]) for k in MOVED)
    for name in BN:  # the global BatchNorm is never aggregated: still the initial one
        assert torch.equal(state[name], initial[name].to(state[name].dtype))
    store = trainer.algorithm.personal
    assert store.ids() == sorted(own) and trainer.algorithm.local_names == frozenset(BN)
    for cid, expected in own.items():
        assert set(store.get(cid)) == set(BN)
        for name, value in expected.items():
            torch.testing.assert_close(store.get(cid)[name], value.to(store.get(cid)[name].dtype), rtol=0, atol=1e-6)
    # the upload is the non-BN delta only
    shared_bytes = sum(initial[k].numel() for k in SHARED) * 8
    assert float(trainer.callback_metrics["round/upload_bytes"]) == PER_ROUND * shared_bytes


def test_the_lean_executor_gives_the_lightning_executors_weights_bit_for_bit():
    lean, lean_trainer = fit(FedBN(), client_executor="lean")
    full, full_trainer = fit(FedBN(), client_executor="lightning")
    assert all(torch.equal(t, full.state_dict()[k]) for k, t in lean.state_dict().items())
    for cid, state in full_trainer.algorithm.personal.items():
        assert all(torch.equal(t, lean_trainer.algorithm.personal.get(cid)[k]) for k, t in state.items())


def test_clients_are_evaluated_with_their_own_batch_norm():
    callback = FederatedEvaluation()
    model, trainer = fit(FedBN(), data=feature_shift_data(holdout_fraction=1 / 3), callbacks=[callback], precision="32-true")
    trained = trainer.algorithm.personal.ids()
    assert float(trainer.callback_metrics["clients/personal/count"]) == len(trained) > 0
    assert "clients/personal/acc_mean" in trainer.callback_metrics
    data = trainer.datamodule
    for r in callback.last_results:
        if r.client_id not in trained:
            assert r.personal_loss is None
            continue
        # by hand: the global model with the client's BatchNorm tensors, in eval mode, on its held-out data
        own = BatchNormMLP(lr=LR)
        own.load_state_dict({**model.state_dict(), **trainer.algorithm.personalized_state(r.client_id)})
        own.eval()
        x, y = (torch.cat(parts) for parts in zip(*data.holdout_dataloader(r.client_id), strict=True))
        with torch.no_grad():
            assert r.personal_loss == pytest.approx(float(F.cross_entropy(own(x), y)), rel=1e-5)
        assert r.personal_loss != pytest.approx(r.loss)


def test_resume_equals_an_uninterrupted_run(tmp_path):
    checkpoint = ModelCheckpoint(dirpath=tmp_path, every_n_epochs=1, save_top_k=-1, filename="{epoch}")
    run = {"max_epochs": 4, "precision": "32-true"}  # under "64-true" even FedAvg resumes only to ~5e-9 (a loop issue)
    straight, trainer = fit(FedBN(), callbacks=[checkpoint], enable_checkpointing=True, **run)
    resumed = new_model(seed=1)
    again = FederatedTrainer(**settings(algorithm=FedBN(), **run))
    again.fit(resumed, datamodule=feature_shift_data(), ckpt_path=tmp_path / "epoch=1.ckpt")
    assert all(torch.equal(t, resumed.state_dict()[k]) for k, t in straight.state_dict().items())
    assert trainer.algorithm.personal.ids() == again.algorithm.personal.ids()
    for cid, state in trainer.algorithm.personal.items():
        assert all(torch.equal(t, again.algorithm.personal.get(cid)[k]) for k, t in state.items())


@pytest.mark.parametrize(
    "wrap", [lambda a: DPFedAvg(noise_multiplier=0.5, clip_norm=1.0, algorithm=a), lambda a: CoordinateMedian(algorithm=a)]
)
def test_composes_with_dp_and_robust_rules_over_the_shared_layers(wrap):
    model = new_model()
    initial = {k: v.detach().double().clone() for k, v in model.state_dict().items()}
    model, trainer = fit(wrap(FedBN()), model=model)
    state = model.state_dict()
    assert all(torch.equal(state[k], initial[k].to(state[k].dtype)) for k in BN)  # nothing released moves the BN
    assert all(not torch.equal(state[k], initial[k]) for k in MOVED)
    assert len(trainer.algorithm.inner.personal) > 0


def test_a_model_without_batch_norm_is_refused():
    with pytest.raises(ValueError, match=r"FedBN keeps local tensors by '_BatchNorm', which matches no tensor of LogisticRegression"):
        fit(FedBN(), model=LogisticRegression(in_features=FEATURES, num_classes=CLASSES))


def test_multi_process_sharding_is_refused(monkeypatch):
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda group=None: 2)
    refusal = r"FedBN's personalised evaluation reads every client's own state.*2 processes.*devices=1"
    with pytest.raises(ValueError, match=refusal):
        FedBN().setup(federation(new_model()))


def test_a_checkpoint_naming_an_unknown_client_is_refused():
    algorithm = FedBN()
    algorithm.setup(federation(new_model()))  # 3 clients
    # The layout of checkpoints written before the loop kept local tensors (the loop's own entry is checked alike).
    saved = {**FedBN().state_dict(), "personal": {"entries": {7: {"net.1.weight": torch.ones(HIDDEN)}}}}
    with pytest.raises(ValueError, match=r"`personal` names client 7, but this federation has clients 0..2"):
        algorithm.load_state_dict(saved)

