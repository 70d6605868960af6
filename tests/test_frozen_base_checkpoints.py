"""Issue 37: a run with a frozen base writes it once beside its checkpoints, not in each; resume stays bit-exact;
a missing or altered base file is one error naming it."""

from __future__ import annotations

import os

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn

from fl_lightning import SCAFFOLD, FedAvg, FederatedParameters, FederatedTrainer, ServerAdam
from fl_lightning.checkpointing.checkpoint_io import CheckpointError, read_checkpoint
from fl_lightning.checkpointing.fingerprint import ResumeMismatchError
from fl_lightning.models import LogisticRegression

from .faults.aggregate_helpers import tiny_data
from .quiet import QUIET

BASE = 64


class FrozenBase(LogisticRegression):
    """A frozen random feature map (3 -> 64) under a trainable logistic regression: the LoRA shape in small."""

    def __init__(self) -> None:
        super().__init__(in_features=BASE, num_classes=2, lr=0.1)
        self.base = nn.Sequential(nn.Linear(3, BASE), nn.Tanh()).requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(self.base(x))


def model(seed: int = 0) -> FrozenBase:
    torch.manual_seed(seed)
    return FrozenBase()


def fit(tmp_path, algorithm, *, max_epochs=3, ckpt_path=None, start=None):
    checkpoint = ModelCheckpoint(dirpath=tmp_path, every_n_epochs=1, save_top_k=-1, filename="{epoch}")
    trainer = FederatedTrainer(
        **{**QUIET, "limit_val_batches": 0, "local_steps": 2, "enable_checkpointing": True}, algorithm=algorithm,
        max_epochs=max_epochs, clients_per_round=2, callbacks=[checkpoint],
    )
    module = start if start is not None else model()
    trainer.fit(module, datamodule=tiny_data(), ckpt_path=ckpt_path)
    return module, trainer


@pytest.mark.parametrize("algorithm", [lambda: FedAvg(server_optimizer=ServerAdam(lr=0.1)), SCAFFOLD], ids=["fedadam", "scaffold"])
def test_the_frozen_base_is_written_once_and_resume_is_bit_exact(tmp_path, algorithm) -> None:
    straight, _ = fit(tmp_path / "a", algorithm())
    files = sorted(os.listdir(tmp_path / "a"))
    bases = [f for f in files if f.startswith("frozen-")]
    assert len(bases) == 1 and sorted(f for f in files if f.endswith(".ckpt")) == ["epoch=0.ckpt", "epoch=1.ckpt", "epoch=2.ckpt"]
    raw = torch.load(tmp_path / "a" / "epoch=1.ckpt", weights_only=True)
    assert not any(name.startswith("base.") for name in raw["state_dict"])  # left to the base file
    # The algorithm's state (server moments, control variates) covers the shared tensors only.
    assert "base.0.weight" not in str(raw["loops"]["fit_loop"]["state_dict"]["federated"]["algorithm"])
    full = read_checkpoint(tmp_path / "a" / "epoch=1.ckpt")
    assert torch.equal(full["state_dict"]["base.0.weight"], model().base[0].weight)

    # Built with another base: the resume puts the checkpoint's back from its base file.
    resumed, _ = fit(tmp_path / "b", algorithm(), ckpt_path=tmp_path / "a" / "epoch=1.ckpt", start=model(seed=1))
    assert all(torch.equal(t, resumed.state_dict()[k]) for k, t in straight.state_dict().items())


def test_a_missing_or_altered_base_file_is_one_error_naming_it(tmp_path) -> None:
    fit(tmp_path, FedAvg(), max_epochs=1)
    (base,) = [tmp_path / f for f in os.listdir(tmp_path) if f.startswith("frozen-")]
    frozen = torch.load(base, weights_only=True)
    frozen["base.0.bias"] = frozen["base.0.bias"] + 1
    torch.save(frozen, base)
    with pytest.raises(CheckpointError, match=rf"{base.name} does not hold the frozen tensors .* altered or replaced"):
        read_checkpoint(tmp_path / "epoch=0.ckpt")
    base.unlink()
    with pytest.raises(CheckpointError, match=rf"keeps its 2 frozen tensors \(e.g. base.0.weight\) in .*{base.name}, which is missing"):
        read_checkpoint(tmp_path / "epoch=0.ckpt")


def test_resuming_with_another_selection_is_refused(tmp_path) -> None:
    fit(tmp_path / "a", FedAvg(), max_epochs=1)
    trainer = FederatedTrainer(
        **{**QUIET, "limit_val_batches": 0, "local_steps": 2}, max_epochs=2, clients_per_round=2,
        federated_parameters=FederatedParameters(local=["net"]),
    )
    with pytest.raises(ResumeMismatchError, match=r"parameters.local: '<absent>' → '2:"):
        trainer.fit(model(), datamodule=tiny_data(), ckpt_path=tmp_path / "a" / "epoch=0.ckpt")


class TiedFrozenBase(FrozenBase):
    """The frozen base's weight under a second name too (a frozen tied embedding, GPT-2's lm_head under peft)."""

    def __init__(self) -> None:
        super().__init__()
        self.alias = nn.Linear(3, BASE, bias=False).requires_grad_(False)
        self.alias.weight = self.base[0].weight


def test_a_tied_frozen_tensor_is_written_and_read_back_under_both_names(tmp_path) -> None:
    torch.manual_seed(0)
    straight, _ = fit(tmp_path / "a", FedAvg(), max_epochs=2, start=TiedFrozenBase())
    full = read_checkpoint(tmp_path / "a" / "epoch=0.ckpt")
    assert torch.equal(full["state_dict"]["alias.weight"], full["state_dict"]["base.0.weight"])
    torch.manual_seed(1)
    resumed, _ = fit(tmp_path / "b", FedAvg(), max_epochs=2, ckpt_path=tmp_path / "a" / "epoch=0.ckpt", start=TiedFrozenBase())
    assert resumed.alias.weight is resumed.base[0].weight
    assert all(torch.equal(t, resumed.state_dict()[k]) for k, t in straight.state_dict().items())
