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


def write_csv(path: Path, users: list[str], seed: int) -> np.ndarray:
    """A tabular file: a user column, four feature columns and a label, as a spreadsheet exports it."""
    rng = np.random.default_rng(seed)
    features = rng.normal(size=(len(users), 4)).round(3)
    labels = (features[:, 0] > 0).astype(int)
    lines = ["user,f0,f1,f2,f3,label"] + [f"{u},{','.join(map(str, f))},{y}" for u, f, y in zip(users, features, labels)]
    path.write_text("\n".join(lines) + "\n")
    return np.concatenate([features, labels[:, None]], axis=1)


def test_a_csv_with_a_user_column_trains_on_stacked_feature_columns(tmp_path: Path):
    users = [f"u{i % 5}" for i in range(40)]
    table = write_csv(tmp_path / "train.csv", users, 0)
    write_csv(tmp_path / "test.csv", users[:10], 1)
    module = HuggingFaceDataModule(
        "csv", data_files={"train": str(tmp_path / "train.csv"), "test": str(tmp_path / "test.csv")},
        user_column="user", columns=[["f0", "f1", "f2", "f3"], "label"], batch_size=4, shuffle=False,
    )  # fmt: skip
    (x, y), *_ = module.client_batches(0, generator=torch.Generator(), num_epochs=1)
    rows = [i for i, u in enumerate(users) if u == "u0"][:4]
    assert x.dtype == torch.float32 and x.shape == (4, 4) and y.dtype == torch.int64
    assert torch.allclose(x, torch.tensor(table[rows, :4], dtype=torch.float32)) and y.tolist() == table[rows, 4].tolist()
    trainer = quiet_trainer(max_epochs=2, clients_per_round=2)
    trainer.fit(MLP(in_features=4, hidden=(8,), num_classes=2), datamodule=module)
    assert trainer.current_epoch == 2


def image_rows(n: int, seed: int) -> dict[str, list]:
    rng = np.random.default_rng(seed)
    from PIL import Image

    pixels = rng.integers(0, 256, (n, 8, 8, 3), dtype=np.uint8)
    return {
        "user_id": [f"w{i % 3}" for i in range(n)],
        "image": [Image.fromarray(p) for p in pixels],  # datasets.Image: PNG bytes, decoded per read
        "raw": list(pixels),  # uint8 [H, W, C] arrays
        "label": rng.integers(0, 4, n).tolist(),
    }


def test_images_arrive_as_float_chw_and_a_fedavg_round_runs(tmp_path: Path):
    """datasets' torch format gives uint8 or int64 pixels (by version and storage), which a float model cannot
    take ("mat1 and mat2 must have the same dtype"): both image storages arrive as float32 [C, H, W] in [0, 1]."""
    from fl_lightning.models.reference import CNN

    rows = image_rows(18, 0)
    splits = datasets.DatasetDict({"train": datasets.Dataset.from_dict(rows), "test": datasets.Dataset.from_dict(image_rows(6, 1))})
    assert type(splits["train"].features["image"]).__name__ == "Image"
    splits.save_to_disk(str(tmp_path / "saved"))  # a save_to_disk folder: read with load_from_disk
    for column in ("image", "raw"):
        module = HuggingFaceDataModule(str(tmp_path / "saved"), user_column="user_id", columns=[column, "label"], batch_size=3, shuffle=False)
        (x, y), *_ = module.client_batches(0, generator=torch.Generator(), num_epochs=1)
        expected = torch.from_numpy(np.stack([np.asarray(rows["image"][i]) for i in (0, 3, 6)])).permute(0, 3, 1, 2) / 255
        assert x.dtype == torch.float32 and x.shape == (3, 3, 8, 8) and torch.equal(x, expected)
        trainer = quiet_trainer(max_epochs=1, clients_per_round=2)
        trainer.fit(CNN(in_channels=3, image_size=8, num_classes=4), datamodule=module)
        assert trainer.current_epoch == 1
    hwc = HuggingFaceClients(splits["train"], "user_id", ["image"], image_layout="HWC").read(0)[0]
    assert hwc.shape == (6, 8, 8, 3)
    # Pixels stored as int64 lists are images when named.
    as_int64 = datasets.Dataset.from_dict({"user_id": ["a"], "pixels": [rows["raw"][0].astype(np.int64)]})
    (x,) = HuggingFaceClients(as_int64, "user_id", ["pixels"], image_columns=["pixels"]).read(0)
    assert x.dtype == torch.float32 and x.shape == (1, 3, 8, 8) and float(x.max()) <= 1


def test_a_transform_sees_each_clients_rows_as_one_batch(tmp_path: Path):
    from PIL import Image

    sizes = [(8, 8), (10, 6), (8, 8)]
    rows = {"user_id": ["a", "a", "b"], "image": [Image.new("L", s, 200) for s in sizes], "label": [0, 1, 2]}
    data = datasets.Dataset.from_dict(rows)
    with pytest.raises(ValueError, match=r"'image' holds values of different shapes in one client .*resize the images"):
        HuggingFaceClients(data, "user_id", ["image", "label"]).read(0)
    calls: list[int] = []

    def resize(batch: dict[str, list]) -> dict[str, list]:
        calls.append(len(batch["label"]))
        return {**batch, "image": [image.resize((4, 4)) for image in batch["image"]], "double": [2 * y for y in batch["label"]]}

    reader = HuggingFaceClients(data, "user_id", ["image", "double"], transform=resize)
    x, double = reader.read(0)
    assert calls == [2] and x.shape == (2, 1, 4, 4) and torch.allclose(x, torch.full_like(x, 200 / 255))
    assert double.tolist() == [0, 2]
    with pytest.raises(ValueError, match=r"`transform` returned no column \['double'\]"):
        HuggingFaceClients(data, "user_id", ["image", "double"], transform=lambda b: b).read(0)


def test_bad_entries_and_non_numeric_columns_are_named():
    data = datasets.Dataset.from_dict({"user_id": ["a"], "f0": [1.0], "word": ["x"]})
    with pytest.raises(ValueError, match=r"a column name or a list of names to stack, got \[\]"):
        HuggingFaceClients(data, "user_id", [[], "f0"])
    with pytest.raises(ValueError, match=r"`image_layout` must be 'CHW' or 'HWC', got 'NCHW'"):
        HuggingFaceClients(data, "user_id", ["f0"], image_layout="NCHW")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"column 'word' holds <U1 values, which are not numbers"):
        HuggingFaceClients(data, "user_id", ["word"]).read(0)
    with pytest.raises(ValueError, match=r"no column \['f9'\]"):
        HuggingFaceClients(data, "user_id", [["f0", "f9"]])


def test_save_to_disk_folders_load_whole(tmp_path: Path):
    """datasets 4.x's load_dataset reads a save_to_disk folder's state.json as JSON rows (columns '_data_files', ...)."""
    split = datasets.Dataset.from_dict(rows(TRAIN_USERS, 0))
    split.save_to_disk(str(tmp_path / "one"))
    module = HuggingFaceDataModule(str(tmp_path / "one"), user_column="user_id", columns=["pixels", "label"], test_split=None)
    assert module.client_ids == ["u1", "u2", "u3"]  # a Dataset's folder is the "train" split
    with pytest.raises(ValueError, match="is a save_to_disk folder, read whole with datasets.load_from_disk"):
        HuggingFaceDataModule(str(tmp_path / "one"), user_column="user_id", columns=["label"], data_files="x.parquet")
