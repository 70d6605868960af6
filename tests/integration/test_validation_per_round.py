"""The quickstart's logged ``val_acc``/``val_loss`` are the global model's, round by round.

A new user saw ``val_acc`` repeat exactly (0.4861 in rounds 1-2, 0.6597 in rounds 3-5) while ``val_loss`` fell.
With 144 validation samples accuracy moves in steps of 1/144, and an independent evaluation of each round's global
weights (``docs/evaluation.md``, "Reading a repeated val_acc") gives the same 70/144 and 95/144 with different
predictions: the repeats are genuine. This test pins every logged value to that evaluation, so a stale metric
(a torchmetrics state not reset, a cached value, a client's weights evaluated) fails it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fl_lightning.callbacks import FederatedCallback
from fl_lightning.cli import FederatedCLI

QUICKSTART = str(Path(__file__).resolve().parents[2] / "configs" / "quickstart.yaml")


class GlobalWeightsPerRound(FederatedCallback):
    """The global model's weights and the logged validation metrics at the end of every round."""

    def __init__(self) -> None:
        self.weights: list[dict[str, torch.Tensor]] = []
        self.logged: list[tuple[float, float]] = []

    def on_round_aggregated(self, trainer, pl_module, round_idx, metrics) -> None:
        self.weights.append(trainer.fit_loop.global_module_state())
        self.logged.append((float(trainer.callback_metrics["val_acc"]), float(trainer.callback_metrics["val_loss"])))


def plain_mlp(weights: dict[str, torch.Tensor]) -> nn.Module:
    """The quickstart's ``MLP(in_features=64, hidden=[128], num_classes=10)`` in plain PyTorch: no Lightning, no
    torchmetrics; ``load_state_dict`` is strict, so a renamed or reshaped layer fails here, not silently."""
    net = nn.Sequential(nn.Flatten(), nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    net.load_state_dict({name.removeprefix("net."): t for name, t in weights.items()})
    return net.eval()


def test_the_quickstarts_logged_validation_is_the_global_models_every_round(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["fl-lightning"])
    rounds = GlobalWeightsPerRound()
    overrides = ["--trainer.max_epochs=4", "--trainer.logger=false", "--trainer.enable_checkpointing=false"]
    cli = FederatedCLI(
        args=["fit", "--config", QUICKSTART, *overrides, "--trainer.enable_progress_bar=false"],
        trainer_defaults={"callbacks": [rounds]},
    )
    data = cli.datamodule
    samples = [data.train[int(i)] for i in data.validation_indices]
    inputs = torch.stack([torch.as_tensor(x) for x, _ in samples]).float()
    labels = torch.as_tensor([int(y) for _, y in samples])
    assert len(labels) == 144 and len(rounds.weights) == 4

    predictions = []
    for weights, (val_acc, val_loss) in zip(rounds.weights, rounds.logged):
        with torch.no_grad():
            logits = plain_mlp(weights)(inputs)
        correct = int((logits.argmax(-1) == labels).sum())
        assert val_acc == pytest.approx(correct / 144, abs=1e-6)
        assert val_loss == pytest.approx(F.cross_entropy(logits, labels).item(), rel=1e-5)
        predictions.append(logits.argmax(-1))
    # Each round is a new model, so the check above compares four different evaluations, not one four times.
    assert all((a != b).any() for a, b in zip(predictions, predictions[1:]))
