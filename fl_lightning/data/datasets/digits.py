"""scikit-learn's bundled 8x8 handwritten digits: a real dataset that needs no download."""

from __future__ import annotations

from typing import Literal

import numpy as np
import torch

from fl_lightning.data._data_checks import check_choice, check_int
from fl_lightning.data.datasets.in_memory import InMemoryDataset


class Digits(InMemoryDataset):
    """The 1,797 UCI handwritten digits shipped with scikit-learn (``load_digits``).

    Pixels are counts in ``0..16``, scaled to ``[0, 1]``. The train/test split is stratified and
    fixed by ``seed``, so the two splits built with the same arguments are complementary.

    Args:
        split: ``"train"`` or ``"test"``.
        as_image: Shape samples ``[1, 8, 8]`` instead of ``[64]``.
        test_fraction: Fraction of the samples in the test split, in ``(0, 1)``.
        seed: Seed of the split.
    """

    def __init__(
        self,
        *,
        split: Literal["train", "test"] = "train",
        as_image: bool = False,
        test_fraction: float = 0.2,
        seed: int = 0,
    ) -> None:
        check_choice("split", split, ("train", "test"))
        if not 0 < test_fraction < 1:
            raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction!r}.")
        check_int("seed", seed, minimum=0)
        # Imported here so that importing fl_lightning.data does not pay for scikit-learn.
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split

        bunch = load_digits()
        train_idx, test_idx = train_test_split(
            np.arange(len(bunch.target)), test_size=test_fraction, stratify=bunch.target, random_state=seed
        )
        idx = np.sort(train_idx if split == "train" else test_idx)
        inputs = torch.from_numpy((bunch.data[idx] / 16.0).astype(np.float32))
        if as_image:
            inputs = inputs.reshape(-1, 1, 8, 8)
        super().__init__(inputs=inputs, labels=torch.from_numpy(bunch.target[idx]), num_classes=10)
