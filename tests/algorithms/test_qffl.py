"""q-FedAvg through FederatedTrainer against a plain-PyTorch q-FedAvg (Li et al. 2020, Algorithm 2) on quadratic devices."""

from __future__ import annotations

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from fl_lightning import CoordinateMedian, DPFedAvg, FederatedCallback, FederatedTrainer, NormClip, QFedAvg
from fl_lightning.algorithms.qffl import LOSS_EPS, START_LOSS

from ..integration.conftest import QUIET
from .quadratic import CENTRES, Quadratic
from .test_fednova import PER_ROUND, SIZES, TRAINER, Selections, sized_data

LR, ROUNDS, STEPS = 0.1, 4, 3
#: Tolerance of the plain reference, which leaves out q-FedAvg's LOSS_EPS (1e-10 added to every F_k).
ATOL = 1e-6
#: Away from every centre, so that no F_k(w^0) is 0 (Algorithm 2's F_k^{q-1} is then undefined for q < 1).
W0 = torch.tensor([1.0, 3.0], dtype=torch.float64)


def start() -> Quadratic:
    module = Quadratic(lr=LR)
    module.w.data.copy_(W0)
    return module


def fit(algorithm, module=None, *, rounds=ROUNDS, **kwargs):
    module = module if module is not None else start()
    selections = Selections()
    callbacks = [selections, *kwargs.pop("callbacks", [])]
    trainer = FederatedTrainer(**{**QUIET, **TRAINER, "max_epochs": rounds, "local_steps": STEPS, **kwargs}, algorithm=algorithm, callbacks=callbacks)
    trainer.fit(module, datamodule=sized_data(batch_size=2))
    return module.w.detach().clone(), selections.rounds, trainer


def reference(
    rounds: list[list[int]], q: float, lipschitz: float = 1 / LR, median: bool = False, eps: float = 0.0
) -> torch.Tensor:
    """Algorithm 2: F_k = F_k(w^t) (here ||w - c_k||^2 / 2); E local GD steps to w_k; Delta w_k = L (w^t - w_k);
    Delta_k = F_k^q Delta w_k; h_k = q F_k^{q-1} ||Delta w_k||^2 + L F_k^q; w^{t+1} = w^t - sum Delta_k / sum h_k.
    ``median``: the coordinate-wise median of the clients' own steps Delta_k / h_k instead."""
    w = W0.clone()
    for selected in rounds:
        deltas, hs = [], []
        for k in selected:
            loss = 0.5 * float(((w - CENTRES[k]) ** 2).sum()) + eps
            v = w.clone()
            for _ in range(STEPS):
                v = v - LR * (v - CENTRES[k])
            dw = lipschitz * (w - v)
            deltas.append(loss**q * dw)
            hs.append(q * loss ** (q - 1) * float(dw @ dw) + lipschitz * loss**q)
        if median:
            w = w - torch.stack([d / h for d, h in zip(deltas, hs)]).median(dim=0).values
        else:
            w = w - sum(deltas) / sum(hs)
    return w


@pytest.mark.parametrize("q", [0.0, 0.5, 2.0])
@pytest.mark.parametrize("sampling", ["samples", "uniform"])
def test_matches_plain_q_fedavg(q, sampling):
    w, rounds, _ = fit(QFedAvg(q=q, sampling=sampling))
    assert len(rounds) == ROUNDS and all(len(r) == PER_ROUND for r in rounds)
    assert torch.allclose(w, reference(rounds, q), atol=ATOL, rtol=0)


class StartLosses(FederatedCallback):
    def __init__(self) -> None:
        self.losses: list[dict[int, float]] = []

    def on_clients_selected(self, trainer, pl_module, round_idx, client_ids):
        self.losses.append({})

    def on_client_end(self, trainer, pl_module, client, update):
        self.losses[-1][client.client_id] = update.metrics[START_LOSS]


def test_loss_probe_follows_a_64_bit_run():
    """Issue 39 item 6: in a 64-true run F_k is probed in float64 (it was cast to float32: 1.3e-7 relative)."""
    losses = StartLosses()
    w, rounds, _ = fit(QFedAvg(q=2.0), rounds=2, callbacks=[losses])
    for k, f_k in losses.losses[0].items():
        exact = 0.5 * float(((W0 - CENTRES[k]) ** 2).sum())
        assert abs(f_k - exact) <= 1e-15 * exact, (k, f_k, exact)
    assert torch.allclose(w, reference(rounds, 2.0, eps=LOSS_EPS), atol=1e-14, rtol=0)


def test_q_changes_the_model_and_an_explicit_lipschitz_constant_is_used():
    fair, rounds, _ = fit(QFedAvg(q=2.0, sampling="uniform"))
    plain, _, _ = fit(QFedAvg(q=0.0, sampling="uniform"))
    assert not torch.allclose(fair, plain, atol=1e-3)
    w, rounds, _ = fit(QFedAvg(q=1.0, lipschitz=3.0))
    assert torch.allclose(w, reference(rounds, 1.0, lipschitz=3.0), atol=ATOL, rtol=0)


def test_clients_are_sampled_in_proportion_to_their_sizes():
    algorithm = fit(QFedAvg(q=1.0), rounds=1)[2].algorithm
    algorithm.federation.clients_per_round = 1
    counts = torch.bincount(torch.tensor([algorithm.select_clients(r)[0] for r in range(4000)]), minlength=4)
    expected = torch.tensor(SIZES, dtype=torch.float64) / sum(SIZES)
    assert torch.allclose(counts.double() / 4000, expected, atol=0.025), counts  # about 4 standard errors


def test_lean_executor_equals_lightning_executor():
    assert torch.equal(fit(QFedAvg(q=1.0), client_executor="lean")[0], fit(QFedAvg(q=1.0), client_executor="lightning")[0])


def test_resume_from_a_mid_run_checkpoint_equals_an_uninterrupted_run(tmp_path):
    checkpoint = ModelCheckpoint(dirpath=tmp_path, every_n_epochs=1, save_top_k=-1, filename="{epoch}")
    straight, _, _ = fit(QFedAvg(q=1.0), callbacks=[checkpoint], enable_checkpointing=True)
    resumed = start()
    again = FederatedTrainer(**{**QUIET, **TRAINER}, max_epochs=ROUNDS, local_steps=STEPS, algorithm=QFedAvg(q=1.0))
    again.fit(resumed, datamodule=sized_data(2), ckpt_path=tmp_path / "epoch=1.ckpt")
    assert torch.equal(resumed.w.detach(), straight)


def test_a_robust_rule_replaces_the_h_weighted_mean_of_the_clients_steps():
    w, rounds, _ = fit(CoordinateMedian(algorithm=QFedAvg(q=1.0)))
    assert torch.allclose(w, reference(rounds, 1.0, median=True), atol=ATOL, rtol=0)


def test_dp_and_update_bounds_refuse_it():
    with pytest.raises(ValueError, match=r"DPFedAvg clips client deltas, but QFedAvg's uploads are not deltas"):
        DPFedAvg(noise_multiplier=1.0, algorithm=QFedAvg())
    with pytest.raises(ValueError, match=r"QFedAvg's uploads are not deltas \(uploads_deltas is False\)"):
        fit(QFedAvg(), update_bound=NormClip(max_norm=1.0))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"q": -1.0}, r"`q` must be a finite number >= 0, got -1.0"),
        ({"q": float("inf")}, r"`q` must be a finite number >= 0, got inf"),
        ({"q": True}, r"`q` must be a finite number >= 0, got True"),
        ({"lipschitz": 0.0}, r"`lipschitz` must be None \(1 / the client learning rate\) or a finite number > 0, got 0.0"),
        ({"sampling": "size"}, r"`sampling` must be 'samples' or 'uniform', got 'size'"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        QFedAvg(**kwargs)
