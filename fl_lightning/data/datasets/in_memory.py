"""The in-memory dataset every bundled dataset derives from."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset

from fl_lightning.data._data_checks import check_int
from fl_lightning.utils.init_args import RecordsInitArgs


class InMemoryDataset(RecordsInitArgs, Dataset[tuple[Tensor, Tensor]]):
    """A labelled dataset held as two tensors, like :class:`torch.utils.data.TensorDataset`.

    The ``tensors`` attribute is what lets :func:`~fl_lightning.data.client_batches` cut a batch
    with one indexing operation instead of collating samples one by one.

    Args:
        inputs: Features, shape ``[N, ...]``.
        labels: Integer class labels in ``[0, num_classes)``, shape ``[N]``.
        num_classes: Number of classes.

    Attributes:
        tensors: ``(inputs, labels)`` with ``labels`` as ``int64``.
        targets: The labels as an ``int64`` NumPy array sharing memory with ``tensors[1]``.
        num_classes: Number of classes.
    """

    def __init__(self, *, inputs: Tensor, labels: Tensor, num_classes: int) -> None:
        self.num_classes = check_int("num_classes", num_classes, minimum=1)
        if labels.ndim != 1 or len(labels) != len(inputs):
            raise ValueError(f"labels must have shape [{len(inputs)}] to match inputs, got {list(labels.shape)}.")
        if labels.is_floating_point() or labels.is_complex():
            raise ValueError(f"labels must be integers, got dtype {labels.dtype}.")
        labels = labels.to(torch.int64)
        if len(labels) and (labels.min() < 0 or labels.max() >= num_classes):
            raise ValueError(
                f"labels must lie in [0, {num_classes}), got range [{int(labels.min())}, {int(labels.max())}]."
            )
        self.tensors: tuple[Tensor, Tensor] = (inputs, labels)
        self.targets: np.ndarray = labels.cpu().numpy()  # partitioners read labels on the host

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        return self.tensors[0][index], self.tensors[1][index]

    def __len__(self) -> int:
        return len(self.tensors[1])
