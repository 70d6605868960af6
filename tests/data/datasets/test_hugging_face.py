"""HuggingFaceDataModule: a user column's values become the clients, on local parquet files and in-memory
datasets (never the network: HF_DATASETS_OFFLINE=1)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

datasets = pytest.importorskip("datasets")

from fl_lightning.data.datasets.hugging_face import HuggingFaceClients, HuggingFaceDataModule  # noqa: E402
from fl_lightning.models import MLP  # noqa: E402

from ...quiet import quiet_trainer  # noqa: E402


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "cache"))


def rows(users: list[str], seed: int) -> dict[str, list]:
    rng = np.random.default_rng(seed)
    return {
        "user_id": users,
        "pixels": rng.random((len(users), 4)).astype(np.float32).tolist(),
        "label": rng.integers(0, 3, len(users)).tolist(),
    }


TRAIN_USERS = ["u2", "u1", "u2", "u3", "u1", "u2"]
TEST_USERS = ["u1", "u2", "u2"]


def write_parquet(tmp_path: Path) -> dict[str, str]:
    files = {}
    for split, users, seed in (("train", TRAIN_USERS, 0), ("test", TEST_USERS, 1)):
        files[split] = str(tmp_path / f"{split}.parquet")
        datasets.Dataset.from_dict(rows(users, seed)).to_parquet(files[split])
    return files


def test_clients_are_the_sorted_users_with_their_rows_in_file_order():
    data = rows(TRAIN_USERS, 0)
    reader = HuggingFaceClients(datasets.Dataset.from_dict(data), "user_id", ["pixels", "label"])
    assert list(reader.client_ids) == ["u1", "u2", "u3"]
    assert reader.num_samples.tolist() == [2, 3, 1]
    pixels, labels = reader.read(1)  # u2: rows 0, 2, 5
    assert torch.equal(labels, torch.tensor([data["label"][i] for i in (0, 2, 5)]))
    assert torch.allclose(pixels, torch.tensor([data["pixels"][i] for i in (0, 2, 5)]))
    numbered = HuggingFaceClients(datasets.Dataset.from_dict({"user": [10, 2, 10], "label": [0, 1, 2]}), "user", ["label"])
    assert list(numbered.client_ids) == ["2", "10"] and numbered.read(1)[0].tolist() == [0, 2]  # numbers sort as numbers


def test_a_parquet_release_gives_the_natural_clients_and_its_test_split(tmp_path: Path):
    module = HuggingFaceDataModule(
        "parquet", data_files=write_parquet(tmp_path), user_column="user_id", columns=["pixels", "label"], batch_size=2
    )
    assert module.client_ids == ["u1", "u2", "u3"] and module.num_clients == 3
    assert [module.client_num_samples(c) for c in range(3)] == [2, 3, 1]
    test_labels = torch.cat([y for _, y in module.test_dataloader()])
    expected = rows(TEST_USERS, 1)["label"]
    assert test_labels.tolist() == [expected[0], expected[1], expected[2]]  # u1's row, then u2's two
    assert len(module.holdout_dataloader(2).dataset) == 0  # u3 has no test rows
    batches = module.client_batches(1, generator=torch.Generator().manual_seed(0), num_epochs=1)
    assert sum(len(y) for _, y in batches) == 3


def test_bad_columns_and_splits_are_named(tmp_path: Path):
    files = write_parquet(tmp_path)
    with pytest.raises(ValueError, match=r"no column \['writer'\]; its columns are \['user_id', 'pixels', 'label'\]"):
        HuggingFaceDataModule("parquet", data_files=files, user_column="writer", columns=["pixels", "label"])
    with pytest.raises(ValueError, match=r"no split \['validation'\]; its splits are \['train', 'test'\]"):
        HuggingFaceDataModule("parquet", data_files=files, user_column="user_id", columns=["label"], val_split="validation")
    data = datasets.Dataset.from_dict({"user_id": ["a", None], "label": [0, 1]})
    with pytest.raises(ValueError, match="'user_id' is empty in 1 rows"):
        HuggingFaceClients(data, "user_id", ["label"])


def test_trains_through_federated_trainer(tmp_path: Path):
    module = HuggingFaceDataModule(
        "parquet", data_files=write_parquet(tmp_path), user_column="user_id", columns=["pixels", "label"], batch_size=2
    )
    trainer = quiet_trainer(max_epochs=2, clients_per_round=2)
    model = MLP(in_features=4, hidden=(8,), num_classes=3)
    trainer.fit(model, datamodule=module)
    assert trainer.current_epoch == 2
    test = rows(TEST_USERS, 1)
    with torch.no_grad():
        expected = (model(torch.tensor(test["pixels"])).argmax(1) == torch.tensor(test["label"])).float().mean()
    assert trainer.test(model, datamodule=module, verbose=False)[0]["test_acc"] == pytest.approx(expected.item())


def test_a_validation_split_is_the_servers_and_no_test_split_means_no_test(tmp_path: Path):
    files = write_parquet(tmp_path)
    files["validation"] = str(tmp_path / "validation.parquet")
    datasets.Dataset.from_dict(rows(["v9", "v1"], 2)).to_parquet(files["validation"])
    module = HuggingFaceDataModule(
        "parquet", data_files=files, user_column="user_id", columns=["label"], val_split="validation", test_split=None
    )
    (labels,), = module.val_dataloader()
    expected = rows(["v9", "v1"], 2)["label"]
    assert labels.tolist() == [expected[1], expected[0]]  # user v1, then v9
    with pytest.raises(RuntimeError, match="has no test split"):
        module.test_dataloader()
