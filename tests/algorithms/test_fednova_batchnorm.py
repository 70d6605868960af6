"""Issue 39 item 4: FedNova's BatchNorm statistics under heterogeneous local steps stay valid.

FedNova's parameter weights tau_eff p_i / ||a_i||_1 sum to >= 1; applied to running statistics they
extrapolate (a negative running variance). Buffers take the plain p_i-weighted mean of their deltas."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from fl_lightning import ClientUpdate, FederatedCallback, FederatedTrainer, FedNova
from fl_lightning.data import FederatedDataModule, InMemoryDataset
from fl_lightning.participation import FixedSteps

from ..faults.algorithm_cases import BatchNormLogisticRegression
from ..integration.conftest import QUIET

STEPS = [1, 30, 30, 30]  # tau_eff * sum_i p_i / tau_i = 22.75 * (0.25 + 0.025) > 1: the old rule overshoots


class RunningVariance(FederatedCallback):
    def __init__(self) -> None:
        self.minimum: list[float] = []

    def on_round_aggregated(self, trainer, pl_module, round_idx, metrics):
        self.minimum.append(float(pl_module.net[0].running_var.min()))


def small_variance_data() -> FederatedDataModule:
    """Inputs of variance 1e-4, far below the initial running variance 1: every client's delta is about -1."""
    g = torch.Generator().manual_seed(0)
    train = InMemoryDataset(inputs=0.01 * torch.randn(160, 3, generator=g), labels=torch.randint(0, 2, (160,), generator=g), num_classes=2)
    test = InMemoryDataset(inputs=0.01 * torch.randn(16, 3, generator=g), labels=torch.randint(0, 2, (16,), generator=g), num_classes=2)
    return FederatedDataModule(train, test, num_clients=4, batch_size=20)


def fit(algorithm) -> tuple[list[float], torch.Tensor]:
    torch.manual_seed(0)
    module, variance = BatchNormLogisticRegression(), RunningVariance()
    trainer = FederatedTrainer(**{**QUIET, "limit_val_batches": 0}, max_epochs=3, local_steps=max(STEPS), algorithm=algorithm, callbacks=[variance])
    trainer.fit(module, datamodule=small_variance_data())
    module.eval()
    with torch.no_grad():
        outputs = module(0.01 * torch.randn(16, 3, generator=torch.Generator().manual_seed(1)))
    return variance.minimum, outputs


def test_running_variance_stays_positive_and_eval_outputs_finite_under_heterogeneous_steps():
    minimum, outputs = fit(FedNova(participation=FixedSteps(STEPS)))
    assert len(minimum) == 3 and min(minimum) > 0, minimum
    assert torch.isfinite(outputs).all()


def test_buffers_take_the_p_weighted_mean_parameters_the_normalised_step():
    """Round arithmetic by hand: steps 1 and 3 (tau_eff = 2), sizes 1 and 3 (p = 1/4, 3/4)."""
    algorithm = FedNova()
    algorithm.momentum = 0.0
    algorithm.federation = SimpleNamespace(param_names={"w"})
    updates = [
        ClientUpdate(client_id=k, num_samples=n, num_steps=s, payload={"w": torch.tensor([d]), "bn.running_var": torch.tensor([v])}, upload_bytes=8)
        for k, (n, s, d, v) in enumerate([(1, 1, -1.0, -0.1), (3, 3, -3.0, -0.9)])
    ]
    state = {"w": torch.tensor([0.0]), "bn.running_var": torch.tensor([1.0])}
    algorithm.aggregate(0, state, updates)
    tau_eff = 0.25 * 1 + 0.75 * 3
    assert torch.allclose(state["w"], torch.tensor([tau_eff * (0.25 * -1.0 / 1 + 0.75 * -3.0 / 3)]))
    assert torch.allclose(state["bn.running_var"], torch.tensor([1.0 + 0.25 * -0.1 + 0.75 * -0.9]))
