"""The partition summary: per-client label counts (flwr-datasets' ``compute_counts``), the text table, the plot
and ``python -m fl_lightning.data.partition_summary``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from fl_lightning.data import FederatedDataModule, InMemoryDataset, Pathological
from fl_lightning.data.partition_summary import format_counts, label_counts, main, plot_counts

LABELS = torch.arange(60) % 4


def datamodule() -> FederatedDataModule:
    train = InMemoryDataset(inputs=torch.zeros(60, 1), labels=LABELS, num_classes=4)
    return FederatedDataModule(train, partitioner=Pathological(2, "deterministic"), num_clients=4, seed=0)


def test_label_counts_are_each_clients_bincount() -> None:
    data = datamodule()
    labels, counts = label_counts(data)
    assert labels.tolist() == [0, 1, 2, 3]
    expected = [np.bincount(LABELS.numpy()[data.client_indices(c)], minlength=4) for c in range(4)]
    np.testing.assert_array_equal(counts, expected)
    # Pathological deterministic: client c holds labels c and c + 1 (mod 4); a label's 15 samples are cut 8 + 7,
    # the 8 to its holder with the smaller number.
    np.testing.assert_array_equal(counts, [[8, 8, 0, 0], [0, 7, 8, 0], [0, 0, 7, 8], [7, 0, 0, 7]])
    assert label_counts(data, max_clients=2)[1].shape == (2, 4)


def test_format_counts_is_a_table_with_totals() -> None:
    text = format_counts([0, 1], np.array([[3, 0], [1, 12]]), client_ids=["alice", "bob"])
    assert text.splitlines() == [
        "client  0   1  total",
        " alice  3   0      3",
        "   bob  1  12     13",
        "--------------------",
        "   all  4  12     16",
    ]


@pytest.mark.parametrize(("kind", "unit"), [("bar", "absolute"), ("bar", "percent"), ("heatmap", "absolute")])
def test_plot_counts_writes_the_image(tmp_path: Path, kind: str, unit: str) -> None:
    pytest.importorskip("matplotlib")
    labels, counts = label_counts(datamodule())
    path = plot_counts(labels, counts, tmp_path / "labels.png", kind=kind, size_unit=unit)  # type: ignore[arg-type]
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000


def test_plot_counts_refuses_an_unknown_kind(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"kind must be 'bar' or 'heatmap', got 'pie'"):
        plot_counts([0], np.ones((1, 1)), tmp_path / "x.png", kind="pie")  # type: ignore[arg-type]


def test_cli_prints_and_plots_a_configs_partition(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    config = {
        "trainer": {"max_epochs": 1},
        "data": {
            "class_path": "fl_lightning.data.FederatedDataModule",
            "init_args": {
                "train": {"class_path": "fl_lightning.data.Digits", "init_args": {"split": "train"}},
                "partitioner": {"class_path": "fl_lightning.data.Pathological", "init_args": {"k": 2, "assignment": "random"}},
                "num_clients": 5,
                "seed": 3,
            },
        },
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    main(["--config", str(path), "--plot", str(tmp_path / "labels.png")])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["client", *map(str, range(10)), "total"]
    rows = [[int(v) for v in line.split()[1:]] for line in lines[1:6]]
    assert all(sum(v > 0 for v in row[:-1]) == 2 for row in rows)  # 2 labels per client
    assert lines[-1] == f"wrote {tmp_path / 'labels.png'}" and (tmp_path / "labels.png").is_file()


def test_cli_federates_a_plain_datamodule_with_the_trainers_settings(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = {
        "trainer": {"num_clients": 3, "partitioner": {"class_path": "fl_lightning.data.Pathological", "init_args": {"k": 1}}},
        "data": {"class_path": "tests.data.user_project.UserDataModule", "init_args": {"num_samples": 30}},
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    main(["--config", str(path)])
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["client", "0", "1", "2", "total"]
    rows = [[int(v) for v in line.split()[1:]] for line in out[1:4]]
    assert all(sum(v > 0 for v in row[:-1]) == 1 for row in rows)  # trainer.partitioner: one label per client


def test_cli_reports_a_config_without_data_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("trainer: {max_epochs: 1}\n")
    with pytest.raises(SystemExit) as exit_info:
        main(["--config", str(path)])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip() == f"error: {str(path)!r} has no `data:` block."


def test_label_counts_of_a_dataset_without_targets_read_each_samples_label() -> None:
    train = torch.utils.data.TensorDataset(torch.zeros(12, 1), torch.arange(12) % 3)
    data = FederatedDataModule(train, num_clients=2, seed=0)
    labels, counts = label_counts(data)
    assert labels.tolist() == [0, 1, 2] and counts.sum() == 12 and counts.sum(axis=0).tolist() == [4, 4, 4]
