"""FedNova through FederatedTrainer against a plain-PyTorch FedNova on quadratic devices of different sizes."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from fl_lightning import DPFedAvg, FedAvg, FederatedCallback, FederatedTrainer, FedNova, ServerSGD, TrimmedMean
from fl_lightning.algorithms.fednova import normalizing_norm
from fl_lightning.data import FederatedDataModule, InMemoryDataset, Natural
from fl_lightning.participation import BinomialSteps, FixedSteps

from ..integration.conftest import QUIET
from .quadratic import CENTRES, Quadratic

LR, ROUNDS, PER_ROUND = 0.1, 4, 3
SIZES = [4, 6, 8, 10]
TRAINER = {"precision": "64-true", "limit_val_batches": 0, "clients_per_round": PER_ROUND}


class MomentumQuadratic(Quadratic):
    """The quadratic devices with heavy-ball SGD (PyTorch's: buf = rho buf + g, w -= lr buf)."""

    def __init__(self, momentum: float = 0.0, optimizer: str = "sgd") -> None:
        super().__init__(lr=LR)
        self.momentum, self.optimizer_name = momentum, optimizer

    def configure_optimizers(self):
        if self.optimizer_name == "adam":
            return torch.optim.Adam(self.parameters(), lr=LR)
        return torch.optim.SGD(self.parameters(), lr=LR, momentum=self.momentum, nesterov=self.optimizer_name == "nesterov")


class Selections(FederatedCallback):
    """The clients each round selects, so the reference trains the same ones."""

    def __init__(self) -> None:
        self.rounds: list[list[int]] = []

    def on_clients_selected(self, trainer, pl_module, round_idx, client_ids):
        self.rounds.append(list(client_ids))


def sized_data(batch_size: int) -> FederatedDataModule:
    """Device k holds SIZES[k] copies of CENTRES[k]: every batch has the gradient w - c_k, in any order."""
    inputs = torch.cat([c.repeat(n, 1) for c, n in zip(CENTRES, SIZES)])
    dataset = InMemoryDataset(inputs=inputs, labels=torch.zeros(len(inputs), dtype=torch.int64), num_classes=2)
    dataset.client_ids = np.repeat(np.arange(len(SIZES)), SIZES)
    return FederatedDataModule(dataset, partitioner=Natural(), num_clients=len(SIZES), batch_size=batch_size)


def fit(algorithm, module=None, *, rounds=ROUNDS, batch_size=2, local_epochs=1, local_steps=None, **kwargs):
    module = module if module is not None else MomentumQuadratic()
    selections = Selections()
    work = {"local_steps": local_steps} if local_steps is not None else {"local_epochs": local_epochs}
    callbacks = [selections, *kwargs.pop("callbacks", [])]
    settings = {**QUIET, **TRAINER, "max_epochs": rounds, **work, **kwargs}
    trainer = FederatedTrainer(**settings, algorithm=algorithm, callbacks=callbacks)
    trainer.fit(module, datamodule=sized_data(batch_size))
    return module.w.detach().clone(), selections.rounds


def reference(rounds: list[list[int]], steps, momentum: float = 0.0, weighting: str = "samples") -> torch.Tensor:
    """Wang et al. 2020: client i runs tau_i heavy-ball SGD steps from x; a_i = [1 - rho^{tau_i - k + 1}]_k / (1 - rho)
    (all ones for plain SGD); x <- x - tau_eff sum_i p_i (x - x_i) / ||a_i||_1, tau_eff = sum_i p_i ||a_i||_1, over
    the clients that took a step, p_i proportional to n_i."""
    x = torch.zeros(2, dtype=torch.float64)
    for round_idx, selected in enumerate(rounds):
        active = [(i, steps(i, round_idx)) for i in selected if steps(i, round_idx) > 0]
        if not active:
            continue
        sizes = torch.tensor([float(SIZES[i]) if weighting == "samples" else 1.0 for i, _ in active], dtype=torch.float64)
        p = sizes / sizes.sum()
        norms, deltas = [], []
        for i, tau in active:
            v, buf = x.clone(), torch.zeros(2, dtype=torch.float64)
            for _ in range(tau):
                buf = momentum * buf + (v - CENTRES[i])
                v = v - LR * buf
            a = [1.0] * tau if momentum == 0 else [(1 - momentum ** (tau - k + 1)) / (1 - momentum) for k in range(1, tau + 1)]
            norms.append(sum(a))
            deltas.append(x - v)
        tau_eff = sum(pi * a for pi, a in zip(p.tolist(), norms))
        x = x - tau_eff * sum(pi * d / a for pi, d, a in zip(p.tolist(), deltas, norms))
    return x


def epochs_steps(client: int, round_idx: int) -> int:
    return -(-SIZES[client] // 2)  # one local epoch in batches of 2


@pytest.mark.parametrize("momentum", [0.0, 0.5])
@pytest.mark.parametrize("weighting", ["samples", "uniform"])
def test_heterogeneous_epochs_match_plain_fednova(momentum, weighting):
    w, rounds = fit(FedNova(weighting=weighting), MomentumQuadratic(momentum))
    assert len(rounds) == ROUNDS and all(len(r) == PER_ROUND for r in rounds)
    assert torch.allclose(w, reference(rounds, epochs_steps, momentum, weighting), atol=1e-10, rtol=0)


def test_heterogeneous_steps_differ_from_fedavg_and_equal_steps_are_fedavg():
    nova, rounds = fit(FedNova())
    fedavg, _ = fit(FedAvg())
    assert not torch.allclose(nova, fedavg, atol=1e-3)  # tau_i = 2, 3, 4, 5: FedAvg's bias shows
    assert torch.allclose(fit(FedNova(), batch_size=10)[0], fit(FedAvg(), batch_size=10)[0], atol=1e-12, rtol=0)


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_flexible_participation_incomplete_and_inactive_clients(momentum):
    steps = [1, 0, 3, 4]
    w, rounds = fit(FedNova(participation=FixedSteps(steps)), MomentumQuadratic(momentum), local_steps=4)
    assert torch.allclose(w, reference(rounds, lambda i, r: steps[i], momentum), atol=1e-10, rtol=0)


def test_random_incomplete_work_matches_the_steps_each_client_reports():
    reported: dict[tuple[int, int], int] = {}

    class Steps(FederatedCallback):
        def on_client_end(self, trainer, pl_module, client, update):
            reported[client.round_idx, client.client_id] = update.num_steps

    w, rounds = fit(FedNova(participation=BinomialSteps([0.3, 0.5, 0.7, 0.9])), local_steps=5, callbacks=[Steps()])
    assert len(set(reported.values())) > 2  # heterogeneous tau_i
    assert torch.allclose(w, reference(rounds, lambda i, r: reported[r, i], 0.0), atol=1e-10, rtol=0)


def test_normalizing_norm_is_the_l1_norm_of_the_papers_a():
    for rho in (0.0, 0.3, 0.9):
        for tau in (0, 1, 7):
            a = [(1 - rho ** (tau - k + 1)) / (1 - rho) for k in range(1, tau + 1)]
            assert normalizing_norm(tau, rho) == pytest.approx(sum(a), rel=1e-12)


def test_lean_executor_equals_lightning_executor():
    lean, _ = fit(FedNova(participation=BinomialSteps(0.6)), MomentumQuadratic(0.5), local_steps=4, client_executor="lean")
    lightning, _ = fit(FedNova(participation=BinomialSteps(0.6)), MomentumQuadratic(0.5), local_steps=4, client_executor="lightning")
    assert torch.equal(lean, lightning)


def test_resume_from_a_mid_run_checkpoint_equals_an_uninterrupted_run(tmp_path):
    def algorithm():
        return FedNova(participation=BinomialSteps(0.6), server_optimizer=ServerSGD(momentum=0.9))

    checkpoint = ModelCheckpoint(dirpath=tmp_path, every_n_epochs=1, save_top_k=-1, filename="{epoch}")
    straight, _ = fit(algorithm(), local_steps=4, callbacks=[checkpoint], enable_checkpointing=True)
    resumed = MomentumQuadratic()
    again = FederatedTrainer(**{**QUIET, **TRAINER}, max_epochs=ROUNDS, local_steps=4, algorithm=algorithm())
    again.fit(resumed, datamodule=sized_data(2), ckpt_path=tmp_path / "epoch=1.ckpt")
    assert torch.equal(resumed.w.detach(), straight)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"weighting": "sample"}, r"`weighting` must be 'samples' or 'uniform', got 'sample'"),
        ({"participation": 0.5}, r"`participation` must be a ParticipationModel or None, got float"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        FedNova(**kwargs)


@pytest.mark.parametrize(
    ("optimizer", "match"),
    [("adam", r"known for torch.optim.SGD .* configures \['Adam'\]"), ("nesterov", r"no nesterov.*'nesterov': True")],
)
def test_other_client_optimizers_are_refused(optimizer, match):
    with pytest.raises(ValueError, match=match):
        fit(FedNova(), MomentumQuadratic(0.5, optimizer=optimizer))


def test_participation_needs_local_steps():
    with pytest.raises(ValueError, match=r"set the trainer's `local_steps`, not `local_epochs`"):
        fit(FedNova(participation=FixedSteps(1)))


def test_dp_and_robust_aggregators_refuse_it():
    with pytest.raises(ValueError, match=r"DPFedAvg needs a synchronous algorithm whose aggregation is a sum .* FedNova is not"):
        DPFedAvg(noise_multiplier=1.0, algorithm=FedNova())
    with pytest.raises(ValueError, match=r"TrimmedMean replaces the average of a group of client updates, but FedNova"):
        TrimmedMean(algorithm=FedNova())

