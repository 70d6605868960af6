"""FederatedProgressBar shows the module's own progress-bar metrics, whatever their names; bars on a
terminal (whole counts and times at 80 columns), one plain line per round off one."""

from __future__ import annotations

import io
import re

from pathlib import Path

import pytest
import torch
from lightning.pytorch.loggers import CSVLogger
from rich.console import Console
from rich.progress import Progress

from fl_lightning import FedBuff, FederatedTrainer
from fl_lightning.callbacks import FederatedProgressBar
from tests.integration.conftest import QUIET
from tests.slash_named import SlashNamedMLP, blob_federation


def terminal(width: int = 120) -> Console:
    """An interactive terminal of ``width`` columns, drawn into memory."""
    return Console(file=io.StringIO(), force_terminal=True, width=width)


def fit(bar: FederatedProgressBar, rounds: int = 2, **kwargs: object) -> None:
    torch.manual_seed(0)
    trainer = FederatedTrainer(max_epochs=rounds, callbacks=[bar], **{**QUIET, "enable_progress_bar": True, **kwargs})
    trainer.fit(SlashNamedMLP.for_blobs(), datamodule=blob_federation())


def round_infos(monkeypatch: pytest.MonkeyPatch, bar: FederatedProgressBar, **kwargs: object) -> list[str]:
    """The metric line the bar shows after each round."""
    infos: list[str] = []
    update = Progress.update

    def record(self: Progress, task_id: int, **kwargs: object) -> None:
        if "info" in kwargs and kwargs.get("advance"):
            infos.append(str(kwargs["info"]))
        update(self, task_id, **kwargs)

    monkeypatch.setattr(Progress, "update", record)
    fit(bar, **kwargs)
    return infos


def test_shows_every_prog_bar_metric_and_the_round_loss(monkeypatch: pytest.MonkeyPatch) -> None:
    infos = round_infos(monkeypatch, FederatedProgressBar(console=terminal()))
    assert len(infos) == 2
    names = [item.split("=")[0] for item in infos[-1].split()]
    assert names == ["val/acc", "round/train_loss"]  # val/nll is logged without prog_bar=True


def test_a_loggers_version_is_not_shown_as_a_metric(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    logger = CSVLogger(tmp_path, name="run")  # Lightning's own bars would show v_num=0
    infos = round_infos(monkeypatch, FederatedProgressBar(console=terminal()), logger=logger)
    assert [item.split("=")[0] for item in infos[-1].split()] == ["val/acc", "round/train_loss"]


def test_shows_the_metrics_it_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    infos = round_infos(monkeypatch, FederatedProgressBar(metrics=["val/nll", "round/clients"], console=terminal()))
    assert [item.split("=")[0] for item in infos[-1].split()] == ["val/nll", "round/clients"]
    assert infos[-1].endswith("round/clients=5")


def test_off_a_terminal_prints_one_plain_line_per_round(monkeypatch: pytest.MonkeyPatch) -> None:
    # A log file (SLURM, CI): a live bar would show only its last frame there.
    log = Console(file=io.StringIO(), width=40)  # narrower than a line: lines must not wrap
    monkeypatch.setattr(Progress, "start", lambda self: pytest.fail("no live bar off a terminal"))
    fit(FederatedProgressBar(console=log), rounds=3)
    lines = log.file.getvalue().splitlines()
    clock = r"\d+:\d\d:\d\d"
    pattern = rf"rounds (\d)/3  val/acc=[\d.]+  round/train_loss=[\d.]+  elapsed {clock}  eta ({clock})"
    matches = [re.fullmatch(pattern, line) for line in lines]
    assert all(matches), lines
    assert [int(m.group(1)) for m in matches] == [1, 2, 3]
    assert matches[-1].group(2) == "0:00:00"  # nothing left after the last round


def test_an_asynchronous_algorithm_counts_aggregations(monkeypatch: pytest.MonkeyPatch) -> None:
    log = Console(file=io.StringIO(), width=200)
    fit(FederatedProgressBar(console=log), rounds=2, algorithm=FedBuff(buffer_size=2))
    lines = log.file.getvalue().splitlines()
    assert [line.split()[:2] for line in lines] == [["aggregations", "1/2"], ["aggregations", "2/2"]], lines


@pytest.mark.parametrize("width", [80, 60])
def test_counts_and_elapsed_time_show_whole_on_a_narrow_terminal(width: int) -> None:
    console = terminal(width)
    fit(FederatedProgressBar(metrics=["val/acc", "val/nll", "round/train_loss", "round/clients"], console=console))
    frames = re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", console.file.getvalue())  # every frame drawn, without cursor moves
    assert "…" not in frames, frames
    assert re.search(r"rounds +━+ 2/2 \d+:\d\d:\d\d", frames), frames
    assert "round/clients=5" in frames, frames  # the metrics fold onto more lines instead
