"""On a CUDA device: FedAvg equals the plain-PyTorch oracle with every client executor, a seed fixes the
weights, and every shipped config runs (downloading ones on stand-ins). Skipped without a GPU (CI has none)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
import yaml

from fl_lightning.cli import FederatedCLI
from fl_lightning.models import MLP

from ..tolerances import cross_path_tolerance
from .config_runs import RUNNABLE, check_two_rounds, two_rounds
from .test_fedavg_oracle import CLIENTS_PER_ROUND, LR, ROUNDS, SEED, plain_fedavg

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def fit_mlp(make_data, make_trainer, executor: str) -> tuple[dict[str, torch.Tensor], torch.nn.Module]:
    """FedAvg of the oracle's set-up on the GPU; the final weights and the initial network."""
    torch.manual_seed(0)
    model = MLP(in_features=64, hidden=(32,), lr=LR)
    initial = copy.deepcopy(model.net)
    trainer = make_trainer(
        accelerator="gpu", devices=1, client_executor=executor,
        max_epochs=ROUNDS, clients_per_round=CLIENTS_PER_ROUND, local_epochs=1, seed=SEED,
    )  # fmt: skip
    trainer.fit(model, datamodule=make_data())
    assert trainer.strategy.root_device.type == "cuda"  # the weights are back on the CPU after fit
    return {k: v.detach().clone() for k, v in model.net.state_dict().items()}, initial


@pytest.mark.parametrize("executor", ["lightning", "lean", "batched"])
def test_fedavg_on_cuda_matches_plain_pytorch_on_cuda(make_data, make_trainer, executor):
    actual, initial = fit_mlp(make_data, make_trainer, executor)
    expected, depth = plain_fedavg(initial.cuda(), make_data(), rounds=ROUNDS, local_epochs=1, local_steps=None)
    tolerance = cross_path_tolerance(torch.float32, depth)
    for name, value in expected.items():
        diff = (actual[name].double() - value.double().cpu()).abs().max().item()
        assert diff <= tolerance, f"{executor}, {name}: max abs difference {diff} > {tolerance:.1e}"


def test_same_seed_same_weights_on_cuda(make_data, make_trainer):
    first, _ = fit_mlp(make_data, make_trainer, "auto")
    second, _ = fit_mlp(make_data, make_trainer, "auto")
    for name in first:
        assert torch.equal(first[name], second[name]), name


@pytest.mark.usefixtures("offline")
@pytest.mark.parametrize("path", RUNNABLE, ids=[p.stem for p in RUNNABLE])
def test_config_runs_on_cuda(path: Path):
    config = yaml.safe_load(path.read_text())
    check_two_rounds(FederatedCLI(args=["fit", "--config", str(path), *two_rounds(config, "gpu")]), config, "cuda")
