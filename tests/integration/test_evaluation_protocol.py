"""The three splits end to end: validation drives selection, the test set is read only when asked."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger
from torch.utils.data import Dataset

from fl_lightning import FedALIGN, FederatedTrainer
from fl_lightning.callbacks import TestCurve
from fl_lightning.cli import checkpoint_test_command, evaluation_rows, print_fit_report
from fl_lightning.data import FederatedDataModule, InMemoryDataset
from fl_lightning.models import MLP
from tests.integration.conftest import QUIET
from tests.slash_named import SlashNamedMLP, blob_federation, blobs


class CountingDataset(Dataset):
    """Counts every sample read, to prove what ``fit`` does not touch."""

    def __init__(self, dataset: InMemoryDataset) -> None:
        self.dataset, self.reads = dataset, 0

    def __getitem__(self, index: int):
        self.reads += 1
        return self.dataset[index]

    def __len__(self) -> int:
        return len(self.dataset)


def setup(
    tmp_path: Path, callbacks: list, max_epochs: int = 3
) -> tuple[FederatedTrainer, MLP, FederatedDataModule, CountingDataset]:
    torch.manual_seed(0)
    test = CountingDataset(blobs(90, seed=1))
    data = FederatedDataModule(blobs(300, seed=0), test, val_fraction=0.2, num_clients=5, batch_size=10)
    model = MLP(in_features=4, hidden=[8], num_classes=3, lr=0.1)
    quiet = {**QUIET, "logger": CSVLogger(tmp_path, name="run"), "enable_checkpointing": True}
    trainer = FederatedTrainer(max_epochs=max_epochs, callbacks=callbacks, default_root_dir=tmp_path, **quiet)
    return trainer, model, data, test


def plain_accuracy(model: MLP, dataset: InMemoryDataset) -> float:
    x, y = dataset.tensors
    with torch.no_grad():
        return (model(x).argmax(-1) == y).float().mean().item()


def test_fit_with_model_selection_never_reads_the_test_set(tmp_path: Path) -> None:
    checkpoint = ModelCheckpoint(dirpath=tmp_path / "ckpt", monitor="val_acc", mode="max")
    early = EarlyStopping(monitor="val_loss", patience=10)
    trainer, model, data, test = setup(tmp_path, [checkpoint, early])
    trainer.fit(model, datamodule=data)
    assert trainer.current_epoch == 3 and checkpoint.best_model_score is not None
    assert test.reads == 0
    # The monitored numbers are the validation split's: plain accuracy of the model on those samples.
    inputs, labels = data.train.tensors
    held = data.validation_indices.tolist()
    val = InMemoryDataset(inputs=inputs[held], labels=labels[held], num_classes=3)
    assert float(trainer.callback_metrics["val_acc"]) == pytest.approx(plain_accuracy(model, val))


def test_fedalign_reads_the_test_set_only_when_asked(tmp_path: Path) -> None:
    """FedALIGN's priority test curve is opt-in (``evaluate_priority=True``)."""
    trainer, model, data, test = setup(tmp_path, [], max_epochs=2)
    trainer.fit_loop.algorithm = FedALIGN(priority=[0, 1], warmup_fraction=0.0)
    trainer.fit(model, datamodule=data)
    assert test.reads == 0
    assert not any(key.startswith("round/priority_test") for key in trainer.callback_metrics)


def test_trainer_test_reports_the_test_set(tmp_path: Path) -> None:
    trainer, model, data, test = setup(tmp_path, [])
    trainer.fit(model, datamodule=data)
    val_acc = float(trainer.callback_metrics["val_acc"])
    (result,) = trainer.test(model, datamodule=data, verbose=False)
    assert test.reads == len(test)
    assert result["test_acc"] == pytest.approx(plain_accuracy(model, test.dataset))
    assert result["test_acc"] != pytest.approx(val_acc)  # not the validation numbers re-reported


def test_test_curve_logs_test_metrics_every_n_rounds(tmp_path: Path) -> None:
    trainer, model, data, test = setup(tmp_path, [TestCurve(every_n_rounds=2)], max_epochs=5)
    trainer.fit(model, datamodule=data)
    assert test.reads == 3 * len(test)  # after rounds 1 and 3, and after the last round (4)
    with open(Path(trainer.logger.log_dir) / "metrics.csv") as file:
        rows = list(csv.DictReader(file))
    assert [int(float(r["round"])) for r in rows if r.get("test_acc")] == [1, 3, 4]
    assert [int(float(r["round"])) for r in rows if r.get("val_acc")] == [0, 1, 2, 3, 4]
    steps = [int(r["step"]) for r in rows]
    assert steps == sorted(steps)
    assert float(trainer.callback_metrics["test_acc"]) == pytest.approx(plain_accuracy(model, test.dataset))


@pytest.mark.parametrize("every", [0, -1, 1.5, True])
def test_test_curve_rejects_a_bad_interval(every: object) -> None:
    with pytest.raises(ValueError, match=rf"every_n_rounds must be an int >= 1, got {every!r}"):
        TestCurve(every_n_rounds=every)  # type: ignore[arg-type]


def fit_slash_named(tmp_path: Path, callbacks: list) -> FederatedTrainer:
    torch.manual_seed(0)
    trainer = FederatedTrainer(
        max_epochs=2, callbacks=callbacks, default_root_dir=tmp_path, **{**QUIET, "enable_checkpointing": True}
    )
    trainer.fit(SlashNamedMLP.for_blobs(), datamodule=blob_federation())
    return trainer


def test_summary_reports_the_modules_own_names_validation_and_test_apart(tmp_path: Path) -> None:
    trainer = fit_slash_named(tmp_path, [ModelCheckpoint(dirpath=tmp_path, monitor="val/nll", mode="min"), TestCurve()])
    metrics = trainer.callback_metrics
    assert checkpoint_test_command(trainer) is None  # TestCurve tested: nothing to print below the table
    assert evaluation_rows(trainer) == [
        ("validation val/nll (monitored, min)", f"{float(metrics['val/nll']):.4f}"),
        ("validation val/acc", f"{float(metrics['val/acc']):.4f}"),
        ("test test/acc (TestCurve, not for selection)", f"{float(metrics['test/acc']):.4f}"),
        ("test test/nll (TestCurve, not for selection)", f"{float(metrics['test/nll']):.4f}"),
    ]


def test_summary_without_a_test_curve_says_how_to_test(tmp_path: Path) -> None:
    checkpoint = ModelCheckpoint(dirpath=tmp_path, monitor="val/acc", mode="max")
    trainer = fit_slash_named(tmp_path, [checkpoint])
    rows = dict(evaluation_rows(trainer))
    assert rows.keys() == {"validation val/acc (monitored, max)", "validation val/nll", "test"}
    assert rows["test"] == "not run in fit: the command follows this table"
    command = f"fl-lightning test --config <this config> --ckpt_path {checkpoint.best_model_path}"
    assert checkpoint_test_command(trainer) == command


def test_the_test_command_is_printed_whole_below_the_table_when_stdout_is_not_a_terminal(tmp_path: Path, capsys) -> None:
    """A new-user finding: inside the table the command wrapped over lines in a log file and could not be copied."""
    directory = tmp_path / "a folder whose name makes the path longer than the table is wide"
    checkpoint = ModelCheckpoint(dirpath=directory, monitor="val/acc", mode="max")
    trainer = fit_slash_named(tmp_path, [checkpoint])
    capsys.readouterr()
    print_fit_report(trainer, wall_time_s=1.0)  # capsys: stdout is not a terminal
    lines = capsys.readouterr().out.splitlines()
    quoted = "'" + checkpoint.best_model_path + "'"  # a path with spaces, quoted for the shell
    assert len(quoted) > 80 and lines[-1] == f"fl-lightning test --config <this config> --ckpt_path {quoted}"
    assert lines[-3].startswith("└") and lines[-2].startswith("Test the global model")  # after the table, not in it


def test_summary_names_a_monitored_metric_that_was_never_logged(tmp_path: Path) -> None:
    trainer = fit_slash_named(tmp_path, [EarlyStopping(monitor="val_acc", strict=False)])  # Lightning lets it pass
    with pytest.raises(ValueError, match=r"monitored metric 'val_acc' was never logged; the logged metrics are \[.*'val/acc'"):
        evaluation_rows(trainer)
