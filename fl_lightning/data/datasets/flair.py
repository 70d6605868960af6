"""FLAIR (Song et al. 2022, "FLAIR: Federated Learning Annotated Image Repository", NeurIPS Datasets and
Benchmarks): 429,078 Flickr images of 51,414 users, multi-label, from the HDF5 file pfl-research's benchmark reads.

The file is what ``benchmarks/dataset/flair/download_preprocess.py`` of https://github.com/apple/pfl-research
writes (from the Hugging Face release ``apple/flair``), and ``prepare_dataset.py`` of
https://github.com/apple/ml-flair writes from the original download, the same layout::

    /<split>/<user_id>/images                    uint8 [n, 256, 256, 3]   (split: train, val, test)
    /<split>/<user_id>/image_ids                 bytes [n]
    /<split>/<user_id>/labels_row                uint16: image of each (image, coarse label) pair
    /<split>/<user_id>/labels_col                uint8:  its label (index into label_mapping)
    /<split>/<user_id>/fine_grained_labels_row   uint16
    /<split>/<user_id>/fine_grained_labels_col   uint16
    /metadata/label_mapping                      JSON {label: index}, the 17 coarse labels sorted
    /metadata/fine_grained_label_mapping         JSON {label: index}, the 1,628 fine labels sorted

A user is in exactly one split (8:1:1 by user). pfl-research's loader (``benchmarks/dataset/flair/common.py``
and ``pytorch.py``) sorts the users of a split, counts a user's images from ``image_ids``, keeps a training
user's first ``max_num_user_images`` (512 in its baseline) and turns the row/column pairs into multi-hot
targets, ``vec[row, col] = 1``; so does this one.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor

from fl_lightning.data._data_checks import check_choice, check_int
from fl_lightning.data.client_reader import IndexedReader, missing_data_error
from fl_lightning.data.natural import NaturalDataModule

#: How to get the file (docs/datasets.md).
FLAIR_SOURCE = (
    "pfl-research (https://github.com/apple/pfl-research, in benchmarks/: python -m dataset.flair.download_preprocess "
    "--output_file flair_federated.hdf5), or ml-flair's prepare_dataset.py (https://github.com/apple/ml-flair)"
)
FlairLabels = Literal["coarse", "fine"]


def _h5py() -> Any:
    try:  # imported here: only HDF5 files need it (the ``datasets`` extra)
        import h5py
    except ImportError:
        raise ImportError("Reading FLAIR's HDF5 file needs h5py: pip install 'fl-lightning[datasets]'.") from None
    return h5py


class ImageRows:
    """A client's ``uint8`` ``[n, H, W, C]`` images, each made ``float32`` ``[C, H, W]`` in ``[0, 1]`` only when
    indexed (a batch at a time), so that a user of 512 images holds 100 MB of bytes, not 400 MB of floats.

    Indexed like the client tensors :func:`~fl_lightning.data.client_batches` slices: an ``int`` gives one
    image, an index tensor or array a batch.
    """

    def __init__(self, images: Tensor) -> None:
        if images.dtype != torch.uint8 or images.dim() != 4:
            raise ValueError(f"images must be uint8 [n, H, W, C], got {images.dtype} {tuple(images.shape)}.")
        self.images = images

    @property
    def device(self) -> torch.device:
        """Where the images are (the CPU): :func:`~fl_lightning.data.client_batches` gathers its indices there."""
        return self.images.device

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int | Tensor | np.ndarray) -> Tensor:
        selected = self.images[torch.as_tensor(index, dtype=torch.int64)]
        return selected.movedim(-1, -3).float().div_(255)


class FlairReader(IndexedReader):
    """The users of one split of FLAIR's HDF5 file, sorted by id; a user's samples are ``(images, labels)``:
    :class:`ImageRows` and the ``float32`` multi-hot ``[n, num_labels]`` label sets.

    Args:
        path: The HDF5 file.
        split: ``"train"``, ``"val"`` or ``"test"``.
        labels: ``"coarse"`` (17 labels) or ``"fine"`` (1,628).
        max_images: Keep a user's first ``max_images`` images (pfl-research's ``max_num_user_images``); ``None``: all.
    """

    def __init__(
        self, path: str | Path, split: str, *, labels: FlairLabels = "coarse", max_images: int | None = None
    ) -> None:
        self.path = Path(path)
        check_choice("split", split, ("train", "val", "test"))
        check_choice("labels", labels, ("coarse", "fine"))
        self.split, self.labels = split, labels
        self.max_images = None if max_images is None else check_int("max_images", max_images, minimum=1)
        self._file: Any = None
        self._pid = os.getpid()
        file = self._h5()
        if split not in file:
            raise ValueError(f"{str(self.path)!r} is not FLAIR's HDF5 file: it has no {split!r} group.")
        mapping = "label_mapping" if labels == "coarse" else "fine_grained_label_mapping"
        if f"metadata/{mapping}" not in file:
            raise ValueError(f"{str(self.path)!r} is not FLAIR's HDF5 file: it has no /metadata/{mapping}.")
        names = json.loads(file[f"metadata/{mapping}"][()])
        #: The label names, by index.
        self.label_names: list[str] = sorted(names, key=names.__getitem__)
        users = file[split]
        self._ids = sorted(users.keys())
        # pfl-research's get_user_num_images: the length of image_ids, from the dataset's shape (nothing is read).
        counts = np.fromiter((users[user]["image_ids"].shape[0] for user in self._ids), dtype=np.int64, count=len(self._ids))
        self._counts = counts if self.max_images is None else np.minimum(counts, self.max_images)

    @property
    def num_labels(self) -> int:
        """Width of the multi-hot label rows."""
        return len(self.label_names)

    def read(self, position: int) -> tuple[Tensor, ...]:
        user = self._h5()[self.split][self._ids[position]]
        n = int(self._counts[position])
        images = torch.from_numpy(np.asarray(user["images"][:n]))
        prefix = "labels" if self.labels == "coarse" else "fine_grained_labels"
        rows = np.asarray(user[f"{prefix}_row"][()], dtype=np.int64)
        cols = np.asarray(user[f"{prefix}_col"][()], dtype=np.int64)
        if len(rows) != len(cols) or (len(cols) and cols.max() >= self.num_labels):
            raise ValueError(
                f"{str(self.path)!r}: user {self._ids[position]!r} has {len(rows)} {prefix}_row and {len(cols)} "
                f"{prefix}_col entries, labels up to {cols.max() if len(cols) else None} of {self.num_labels}; "
                "the file is corrupt (re-run the preprocessing)."
            )
        kept = rows < n  # the labels of the images kept
        targets = np.zeros((n, self.num_labels), dtype=np.float32)
        targets[rows[kept], cols[kept]] = 1.0
        return ImageRows(images), torch.from_numpy(targets)

    def _h5(self) -> Any:
        # Opened on first use in each process: an HDF5 handle must not cross a fork or a pickle.
        if self._file is None or self._pid != os.getpid():
            self._file = _h5py().File(self.path, "r")
            self._pid = os.getpid()
        return self._file

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_file": None}


class Flair(NaturalDataModule):
    """FLAIR as pfl-research's benchmark reads it: one client per training user (41,131; 345,879 images), the
    ``val`` split (5,141 users) for the server's validation and ``test`` (5,142 users) for the test, pooled
    (they are other users, so no client has held-out data of its own).

    A sample is an image as ``float32`` ``[3, 256, 256]`` in ``[0, 1]`` and its labels as a multi-hot
    ``float32`` row: the 17 coarse labels (``labels="coarse"``, pfl's default) or the 1,628 fine ones.
    pfl-research's model then normalises with ImageNet's channel means and deviations and crops to 224
    (:class:`~fl_lightning.models.FlairResNet18`).

    Args:
        root: The folder holding ``file``.
        labels: ``"coarse"`` or ``"fine"`` (pfl's ``use_fine_grained_labels``).
        max_images: A training user's images kept, its first ones (pfl's ``max_num_user_images``, 512 in its
            baseline); ``None``: all. The validation and test users keep all theirs, as pfl's central evaluation.
        file: The HDF5 file's name.
        **kwargs: :class:`~fl_lightning.data.natural.NaturalDataModule`'s (``batch_size``, ...); with
            ``val_fraction`` the validation split is taken from the training users instead of ``val``.
    """

    def __init__(
        self,
        root: str,
        *,
        labels: FlairLabels = "coarse",
        max_images: int | None = 512,
        file: str = "flair_federated.hdf5",
        **kwargs: Any,
    ) -> None:
        path = Path(root) / file
        if not path.is_file():
            raise missing_data_error("Flair", path, source=FLAIR_SOURCE, folder=path.parent)
        train = FlairReader(path, "train", labels=labels, max_images=max_images)
        test = FlairReader(path, "test", labels=labels)
        val = None if kwargs.get("val_fraction") is not None else FlairReader(path, "val", labels=labels)
        self.num_classes = train.num_labels
        self.label_names = train.label_names
        super().__init__(train, test, test_by_client=False, val=val, **kwargs)
