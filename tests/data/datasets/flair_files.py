"""Writes FLAIR HDF5 files in the exact layout of pfl-research's ``benchmarks/dataset/flair/download_preprocess.py``
(and ml-flair's ``prepare_dataset.py``): the same paths, dtypes and metadata, with tiny images and made-up label
names (``docs/datasets.md``)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

#: 17 coarse labels, as FLAIR has, and some fine ones ("coarse/fine"), sorted as the preprocessing indexes them.
COARSE = sorted(f"coarse{i:02d}" for i in range(17))
FINE = sorted(f"{c}/fine{j}" for c in COARSE[:8] for j in range(5))


def flair_user(rng: np.random.Generator, n: int, size: int = 8) -> dict[str, object]:
    """One user's ``n`` images (``uint8 [n, size, size, 3]``) and 1-3 fine labels per image (with their coarse ones)."""
    fine = [sorted(rng.choice(len(FINE), size=int(rng.integers(1, 4)), replace=False).tolist()) for _ in range(n)]
    coarse = [sorted({COARSE.index(FINE[f].split("/")[0]) for f in labels}) for labels in fine]
    return {"images": rng.integers(0, 256, (n, size, size, 3), dtype=np.uint8), "coarse": coarse, "fine": fine}


def write_flair(path: Path, splits: dict[str, dict[str, dict[str, object]]]) -> None:
    """``splits[split][user_id]`` = a :func:`flair_user`, written as the preprocessing writes it."""
    import h5py

    path.parent.mkdir(parents=True, exist_ok=True)
    with h5py.File(path, "w") as h5file:
        for partition, users in splits.items():
            for user_id, user in users.items():
                images, coarse, fine = user["images"], user["coarse"], user["fine"]
                assert isinstance(images, np.ndarray) and isinstance(coarse, list) and isinstance(fine, list)
                labels_row = [j for j, labels in enumerate(coarse) for _ in labels]
                labels_col = [c for labels in coarse for c in labels]
                fine_row = [j for j, labels in enumerate(fine) for _ in labels]
                fine_col = [f for labels in fine for f in labels]
                h5file[f"/{partition}/{user_id}/labels_row"] = np.asarray(labels_row, dtype=np.uint16)
                h5file[f"/{partition}/{user_id}/labels_col"] = np.asarray(labels_col, dtype=np.uint8)
                h5file[f"/{partition}/{user_id}/fine_grained_labels_row"] = np.asarray(fine_row, dtype=np.uint16)
                h5file[f"/{partition}/{user_id}/fine_grained_labels_col"] = np.asarray(fine_col, dtype=np.uint16)
                image_ids = [f"{user_id}_{j}".encode() for j in range(len(images))]
                h5file[f"/{partition}/{user_id}/image_ids"] = np.asarray(image_ids, dtype="S")
                h5file.create_dataset(f"/{partition}/{user_id}/images", data=images)
        h5file["/metadata/label_mapping"] = json.dumps({label: i for i, label in enumerate(COARSE)})
        h5file["/metadata/fine_grained_label_mapping"] = json.dumps({label: i for i, label in enumerate(FINE)})


def write_flair_splits(root: Path, *, train: int = 4, images: int = 6, seed: int = 0) -> dict[str, dict[str, dict[str, object]]]:
    """``<root>/flair_federated.hdf5`` with ``train`` training users of ``images`` images, 2 validation and 2 test
    users; returns what was written."""
    rng = np.random.default_rng(seed)
    splits = {
        "train": {f"{9 - i:02d}train": flair_user(rng, images + i) for i in range(train)},  # ids not in writing order
        "val": {f"v{i}": flair_user(rng, 3) for i in range(2)},
        "test": {f"t{i}": flair_user(rng, 2 + i) for i in range(2)},
    }
    write_flair(root / "flair_federated.hdf5", splits)
    return splits
