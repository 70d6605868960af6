"""FederatedProgressBar shows the module's own progress-bar metrics, whatever their names."""

from __future__ import annotations

import pytest
import torch
from rich.progress import Progress

from fl_lightning import FederatedTrainer
from fl_lightning.callbacks import FederatedProgressBar
from tests.integration.conftest import QUIET
from tests.slash_named import SlashNamedMLP, blob_federation


def round_infos(monkeypatch: pytest.MonkeyPatch, bar: FederatedProgressBar) -> list[str]:
    """The metric line the bar shows after each round."""
    infos: list[str] = []
    update = Progress.update

    def record(self: Progress, task_id: int, **kwargs: object) -> None:
        if "info" in kwargs and kwargs.get("advance"):
            infos.append(str(kwargs["info"]))
        update(self, task_id, **kwargs)

    monkeypatch.setattr(Progress, "update", record)
    torch.manual_seed(0)
    trainer = FederatedTrainer(max_epochs=2, callbacks=[bar], **{**QUIET, "enable_progress_bar": True})
    trainer.fit(SlashNamedMLP.for_blobs(), datamodule=blob_federation())
    return infos


def test_shows_every_prog_bar_metric_and_the_round_loss(monkeypatch: pytest.MonkeyPatch) -> None:
    infos = round_infos(monkeypatch, FederatedProgressBar())
    assert len(infos) == 2
    names = [item.split("=")[0] for item in infos[-1].split()]
    assert names == ["val/acc", "round/train_loss"]  # val/nll is logged without prog_bar=True


def test_shows_the_metrics_it_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    infos = round_infos(monkeypatch, FederatedProgressBar(metrics=["val/nll", "round/clients"]))
    assert [item.split("=")[0] for item in infos[-1].split()] == ["val/nll", "round/clients"]
    assert infos[-1].endswith("round/clients=5")
