"""torchvision image datasets, materialised once as normalised in-memory tensors.

Reading a torchvision dataset's raw ``data`` array takes a fraction of a second, whereas going
through ``__getitem__`` and PIL takes seconds per epoch; federated training touches every
client's data each round, so the datasets are decoded once and kept as float32 tensors.
"""

from __future__ import annotations

import importlib
import os
import shutil
from typing import Any, ClassVar, Literal

import numpy as np
import torch
from torch import Tensor
from typing_extensions import override

from fl_lightning.data._data_checks import check_choice
from fl_lightning.data.augment import RandomCropFlip
from fl_lightning.data.datasets.in_memory import InMemoryDataset

# Classes per EMNIST split; ``letters`` counts 26 because its labels are shifted to start at 0.
_EMNIST_CLASSES = {"byclass": 62, "bymerge": 47, "balanced": 47, "letters": 26, "digits": 10, "mnist": 10}


#: Where torchvision looks for each dataset's files.
_FILES = {
    "MNIST": "{root}/MNIST/raw/ (the four *-ubyte.gz files)",
    "FashionMNIST": "{root}/FashionMNIST/raw/ (the four *-ubyte.gz files)",
    "EMNIST": "{root}/EMNIST/raw/ (gzip.zip)",
    "CIFAR10": "{root}/cifar-10-python.tar.gz (or its extracted folder {root}/cifar-10-batches-py/)",
    "CIFAR100": "{root}/cifar-100-python.tar.gz (or its extracted folder {root}/cifar-100-python/)",
    "SVHN": "{root}/<split>_32x32.mat (train, test, extra)",
}


def load_torchvision(name: str, *, root: str, download: bool, **kwargs: Any) -> Any:
    """Instantiates ``torchvision.datasets.<name>``, turning its missing-data and download errors into
    one clear message that names the dataset and where its files go.

    A failed download (no network, a dead mirror) leaves nothing behind: the folders and files it
    created under ``root`` are removed, so the next attempt does not find half a dataset.

    Raises:
        FileNotFoundError: The data is not under ``root`` and ``download`` is false, or its download failed.
    """
    # Looked up at call time so that importing fl_lightning.data does not import torchvision.
    datasets = importlib.import_module("torchvision.datasets")
    where = _FILES.get(name, "{root}/").format(root=os.path.normpath(root))
    existing = set(os.listdir(root)) if os.path.isdir(root) else None
    try:
        return getattr(datasets, name)(root=root, download=download, **kwargs)
    except RuntimeError as err:
        if download:
            _remove_new_entries(root, existing)
            raise FileNotFoundError(_download_failed(name, root, where, err)) from err
        raise FileNotFoundError(
            f"{name} was not found (or is corrupted) under root={root!r}; pass download=True to fetch it, or put "
            f"its files at {where}."
        ) from err
    except OSError as err:  # no network: URLError, socket errors, timeouts
        if not download:
            raise
        _remove_new_entries(root, existing)
        raise FileNotFoundError(_download_failed(name, root, where, err)) from err


def _download_failed(name: str, root: str, where: str, err: BaseException) -> str:
    # torchvision lists every mirror it tried; the last line is the last mirror's error.
    reason = [line for line in str(err).splitlines() if line.strip()][-1:] or [type(err).__name__]
    return (
        f"{name} could not be downloaded to root={root!r} ({reason[0].strip()}). Without network access, download it "
        f"on a machine with access (torchvision.datasets.{name}(root=..., download=True)), copy its files to {where} "
        "and set download=False."
    )


def _remove_new_entries(root: str, existing: set[str] | None) -> None:
    """Removes what appeared under ``root`` since ``existing`` was listed (all of ``root`` if it was not there)."""
    if existing is None:
        shutil.rmtree(root, ignore_errors=True)
        return
    for entry in set(os.listdir(root)) - existing:
        path = os.path.join(root, entry)
        if os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            os.remove(path)


def materialise(
    source: Any, *, mean: tuple[float, ...], std: tuple[float, ...], channels_last: bool = False
) -> tuple[Tensor, Tensor]:
    """Converts a torchvision dataset's raw ``uint8`` images to normalised float32 ``[N, C, H, W]``.

    Args:
        source: A torchvision-style dataset with a ``data`` array (``[N, H, W]``, or
            ``[N, H, W, C]`` when ``channels_last``, else ``[N, C, H, W]``) and ``targets`` or
            ``labels``.
        mean: Per-channel mean of the pixels scaled to ``[0, 1]``.
        std: Per-channel standard deviation of the same.
        channels_last: Whether colour images are stored ``[N, H, W, C]`` (CIFAR).

    Returns:
        ``(inputs, labels)`` with ``inputs`` float32 ``[N, C, H, W]`` and ``labels`` int64 ``[N]``.
    """
    data = torch.as_tensor(np.asarray(source.data))
    if data.ndim == 3:
        data = data.unsqueeze(1)
    elif channels_last:
        data = data.permute(0, 3, 1, 2)
    if data.shape[1] != len(mean):
        raise ValueError(f"expected {len(mean)} channel(s), got images of shape {list(data.shape[1:])}.")
    channel = (1, -1, 1, 1)
    inputs = data.to(torch.float32).div_(255.0)
    inputs = inputs.sub_(torch.tensor(mean).view(channel)).div_(torch.tensor(std).view(channel))
    labels = source.targets if hasattr(source, "targets") else source.labels
    return inputs.contiguous(), torch.as_tensor(np.asarray(labels), dtype=torch.int64)


class TorchvisionDataset(InMemoryDataset):
    """Base of the wrappers: which torchvision class to load and how to normalise it.

    Args:
        root: Directory holding (or receiving) the data.
        train: Training or test split.
        download: Download the data if it is missing.
        augment: Random crop (4 pixels of black padding) and horizontal flip of every training
            batch (:class:`~fl_lightning.data.augment.RandomCropFlip`), seeded by the client's
            data seed; for a training split only.

    Attributes:
        source_name: Name of the class in ``torchvision.datasets``.
        mean: Per-channel pixel mean (pixels in ``[0, 1]``), used to normalise.
        std: Per-channel pixel standard deviation, used to normalise.
        channels_last: Whether torchvision stores the images ``[N, H, W, C]``.
        class_count: Number of classes.
    """

    source_name: ClassVar[str]
    mean: ClassVar[tuple[float, ...]]
    std: ClassVar[tuple[float, ...]]
    channels_last: ClassVar[bool] = False
    class_count: ClassVar[int]

    def __init__(self, *, root: str = "data", train: bool = True, download: bool = False, augment: bool = False) -> None:
        self._materialise(root=root, download=download, num_classes=self.class_count, train=train)
        #: Batch-level training augmentation that :func:`~fl_lightning.data.client_batches` applies.
        self.train_transform = self.crop_flip() if augment else None

    def crop_flip(self) -> RandomCropFlip:
        """The CIFAR training augmentation, padding with black (``-mean / std`` once normalised)."""
        return RandomCropFlip(padding=4, fill=[-m / s for m, s in zip(self.mean, self.std)])

    def _materialise(self, *, root: str, download: bool, num_classes: int, **kwargs: Any) -> None:
        source = load_torchvision(self.source_name, root=root, download=download, **kwargs)
        inputs, labels = materialise(source, mean=self.mean, std=self.std, channels_last=self.channels_last)
        inputs, labels = self._adapt(inputs, labels)
        super().__init__(inputs=inputs, labels=labels, num_classes=num_classes)

    def _adapt(self, inputs: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
        """Dataset-specific fix-ups of the materialised tensors."""
        return inputs, labels


class MNIST(TorchvisionDataset):
    """MNIST handwritten digits, ``[1, 28, 28]``, 10 classes."""

    source_name = "MNIST"
    mean = (0.1307,)
    std = (0.3081,)
    class_count = 10


class FashionMNIST(TorchvisionDataset):
    """Fashion-MNIST clothing images, ``[1, 28, 28]``, 10 classes."""

    source_name = "FashionMNIST"
    mean = (0.2860,)
    std = (0.3530,)
    class_count = 10


class CIFAR10(TorchvisionDataset):
    """CIFAR-10, ``[3, 32, 32]``, 10 classes."""

    source_name = "CIFAR10"
    mean = (0.4914, 0.4822, 0.4465)
    std = (0.2470, 0.2435, 0.2616)
    channels_last = True
    class_count = 10


class CIFAR100(TorchvisionDataset):
    """CIFAR-100 (fine labels), ``[3, 32, 32]``, 100 classes."""

    source_name = "CIFAR100"
    mean = (0.5071, 0.4865, 0.4409)
    std = (0.2673, 0.2564, 0.2762)
    channels_last = True
    class_count = 100


class EMNIST(TorchvisionDataset):
    """EMNIST, ``[1, 28, 28]``.

    The raw images are stored transposed; they are turned upright here. ``letters`` labels
    ``1..26`` are shifted to ``0..25`` (torchvision keeps an unused class 0).

    Args:
        split_name: One of ``byclass``, ``bymerge``, ``balanced``, ``letters``, ``digits``, ``mnist``.
        root: Directory holding (or receiving) the data.
        train: Training or test split.
        download: Download the data if it is missing.
    """

    source_name = "EMNIST"
    mean = (0.1722,)
    std = (0.3309,)

    def __init__(
        self, *, split_name: str = "letters", root: str = "data", train: bool = True, download: bool = False
    ) -> None:
        check_choice("split_name", split_name, tuple(_EMNIST_CLASSES))
        self.split_name = split_name
        self._materialise(
            root=root, download=download, num_classes=_EMNIST_CLASSES[split_name], split=split_name, train=train
        )

    @override
    def _adapt(self, inputs: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
        # torchvision keeps EMNIST's on-disk layout, which is the transpose of the upright image.
        inputs = inputs.transpose(-1, -2).contiguous()
        return inputs, labels - 1 if self.split_name == "letters" else labels


class SVHN(TorchvisionDataset):
    """Street View House Numbers, ``[3, 32, 32]``, 10 classes.

    Args:
        split: ``"train"``, ``"test"`` or ``"extra"``.
        root: Directory holding (or receiving) the data.
        download: Download the data if it is missing.
    """

    source_name = "SVHN"
    mean = (0.4377, 0.4438, 0.4728)
    std = (0.1980, 0.2010, 0.1970)
    class_count = 10

    def __init__(
        self, *, split: Literal["train", "test", "extra"] = "train", root: str = "data", download: bool = False
    ) -> None:
        check_choice("split", split, ("train", "test", "extra"))
        self._materialise(root=root, download=download, num_classes=self.class_count, split=split)
