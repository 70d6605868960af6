"""FLAIR from an HDF5 file in pfl-research's exact layout (``flair_files.py``): users, counts, images, multi-hot
labels (coarse and fine), the cap on a user's images, the splits, the summary, and the missing-file error."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from fl_lightning.data.datasets.flair import Flair, FlairReader, ImageRows
from fl_lightning.data.partition_summary import label_counts

from .flair_files import COARSE, FINE, write_flair_splits

pytest.importorskip("h5py")


def multi_hot(label_sets: list[list[int]], width: int) -> np.ndarray:
    rows = np.zeros((len(label_sets), width), dtype=np.float32)
    for i, labels in enumerate(label_sets):
        rows[i, labels] = 1
    return rows


def test_reader_gives_each_user_its_images_and_label_sets(tmp_path: Path) -> None:
    written = write_flair_splits(tmp_path)
    path = tmp_path / "flair_federated.hdf5"
    for labels, names in (("coarse", COARSE), ("fine", FINE)):
        reader = FlairReader(path, "train", labels=labels)  # type: ignore[arg-type]
        users = written["train"]
        assert list(reader.client_ids) == sorted(users)  # pfl-research sorts a split's users
        assert reader.num_samples.tolist() == [len(users[u]["images"]) for u in sorted(users)]  # type: ignore[arg-type]
        assert reader.label_names == names and reader.num_labels == len(names)
        for position, user in enumerate(sorted(users)):
            images, targets = reader.read(position)
            assert isinstance(images, ImageRows) and len(images) == reader.num_samples[position]
            expected = torch.from_numpy(users[user]["images"]).permute(0, 3, 1, 2).float() / 255  # type: ignore[arg-type]
            torch.testing.assert_close(images[torch.arange(len(images))], expected)
            torch.testing.assert_close(images[1], expected[1])
            np.testing.assert_array_equal(targets.numpy(), multi_hot(users[user][labels], len(names)))  # type: ignore[arg-type]


def test_max_images_keeps_a_users_first_images_and_their_labels(tmp_path: Path) -> None:
    written = write_flair_splits(tmp_path, images=6)
    reader = FlairReader(tmp_path / "flair_federated.hdf5", "train", max_images=7)
    assert reader.num_samples.tolist() == [7, 7, 7, 6]  # users of 9, 8, 7 and 6 images, sorted by id
    user = written["train"][reader.client_ids[0]]
    images, targets = reader.read(0)
    torch.testing.assert_close(images[torch.arange(7)], torch.from_numpy(user["images"][:7]).permute(0, 3, 1, 2).float() / 255)  # type: ignore[index]
    np.testing.assert_array_equal(targets.numpy(), multi_hot(user["coarse"][:7], 17))  # type: ignore[index]


def test_data_module_trains_on_train_validates_on_val_and_tests_on_test(tmp_path: Path) -> None:
    write_flair_splits(tmp_path)
    data = Flair(str(tmp_path), batch_size=4, max_images=None)
    assert data.num_clients == 4 and data.num_classes == 17 and data.label_names == COARSE
    assert data.val is not None and list(data.val.client_ids) == ["v0", "v1"]
    assert data.test is not None and list(data.test.client_ids) == ["t0", "t1"]
    batch = next(iter(data.client_batches(0, generator=torch.Generator().manual_seed(0), num_epochs=1)))
    x, y = batch
    assert x.shape == (4, 3, 8, 8) and x.dtype == torch.float32 and 0 <= x.min() and x.max() <= 1
    assert y.shape == (4, 17) and set(y.unique().tolist()) <= {0.0, 1.0}
    val = next(iter(data.val_dataloader()))
    assert val[0].shape == (6, 3, 8, 8) and val[1].shape == (6, 17)
    with pytest.raises(RuntimeError, match="test clients that are not its training clients"):
        data.holdout_dataloader(0)
    fine = Flair(str(tmp_path), labels="fine", val_fraction=0.2)
    assert fine.num_classes == len(FINE) and fine.val is not None and list(fine.val.client_ids) == list(fine.client_ids)


def test_summary_counts_each_users_labels(tmp_path: Path) -> None:
    written = write_flair_splits(tmp_path)
    data = Flair(str(tmp_path))
    labels, counts = label_counts(data)
    assert labels.tolist() == list(range(17))
    users = written["train"]
    expected = [multi_hot(users[u]["coarse"], 17).sum(axis=0) for u in sorted(users)]  # type: ignore[arg-type]
    np.testing.assert_array_equal(counts, expected)


def test_a_missing_file_is_one_error_naming_the_dataset_path_and_source(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError) as error:
        Flair(str(tmp_path / "flair"))
    message = str(error.value)
    assert message.startswith(f"Flair: {str(tmp_path / 'flair' / 'flair_federated.hdf5')!r} does not exist.")
    assert "python -m dataset.flair.download_preprocess --output_file flair_federated.hdf5" in message
    assert "https://github.com/apple/pfl-research" in message and str(tmp_path / "flair") in message


def test_a_file_of_another_layout_is_refused_naming_what_is_missing(tmp_path: Path) -> None:
    import h5py

    with h5py.File(tmp_path / "flair_federated.hdf5", "w") as file:
        file["/examples/c0/pixels"] = np.zeros((2, 28, 28))  # a TFF HDF5 file
    with pytest.raises(ValueError, match=r"is not FLAIR's HDF5 file: it has no 'train' group"):
        Flair(str(tmp_path))
    with pytest.raises(ValueError, match=r"split must be one of \['train', 'val', 'test'\], got 'validation'"):
        FlairReader(tmp_path / "flair_federated.hdf5", "validation")
