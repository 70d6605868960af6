"""TensorFlow Federated's federated datasets (``tff.simulation.datasets``), from the SQLite files TFF publishes:
EMNIST-62, Shakespeare, StackOverflow (next-word prediction) and CIFAR-100 (Pachinko allocation).

Each takes ``root``, the folder holding the decompressed ``<name>.sqlite`` (or, where only that is there, TFF's
older HDF5 release of the dataset: ``fed_emnist_train.h5``, ...); the clients are TFF's, sorted by id, and
TFF's splits are the standard ones. The preprocessing into tensors is TFF's baseline
preprocessing (``tff.simulation.baselines``, as used by Reddi et al. 2021, "Adaptive Federated
Optimization"), transcribed without TensorFlow; ``docs/datasets.md`` gives sizes and layouts.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor

from fl_lightning.data._data_checks import check_choice, check_int
from fl_lightning.data.client_reader import ClientReader, missing_data_error
from fl_lightning.data.datasets.tff_hdf5 import TffHdf5Reader
from fl_lightning.data.datasets.tff_sqlite import TFF_URL, Count, Decode, TffSqliteReader
from fl_lightning.data.natural import NaturalDataModule


def tff_split(
    root: str, sqlite: str, split: str, hdf5: str, decode: Decode, *, dataset: str, count: Count | None = None
) -> ClientReader:
    """Split ``split`` of ``<root>/<sqlite>``, or where only TFF's older HDF5 release is there, ``<root>/<hdf5>``."""
    sqlite_path, hdf5_path = Path(root) / sqlite, Path(root) / hdf5
    if not sqlite_path.is_file() and not hdf5_path.is_file():
        source = f"{TFF_URL}/{sqlite}.lzma (then: unxz {sqlite}.lzma), or TFF's older HDF5 release with {hdf5}"
        raise missing_data_error(dataset, sqlite_path, source=source, folder=sqlite_path.parent)
    if sqlite_path.is_file():
        return TffSqliteReader(sqlite_path, split, decode, dataset=dataset, count=count)
    return TffHdf5Reader(hdf5_path, decode, count=count)


def stackoverflow_counts(root: str, kind: Literal["word_count", "tag_count"], *, dataset: str) -> Path:
    """TFF's ``<root>/stackoverflow.<kind>`` (``load_word_counts``/``load_tag_counts``), or the missing-file error."""
    path = Path(root) / f"stackoverflow.{kind}"
    if not path.is_file():
        source = f"{TFF_URL}/stackoverflow.{kind}.tar.bz2 (then: tar xjf stackoverflow.{kind}.tar.bz2)"
        raise missing_data_error(dataset, path, source=source, folder=path.parent)
    return path


def stackoverflow_words(root: str, size: int, *, dataset: str) -> list[str]:
    """The first ``size`` words of ``stackoverflow.word_count`` (``word count`` a line, most frequent first)."""
    with open(stackoverflow_counts(root, "word_count", dataset=dataset), encoding="utf-8") as file:
        return [line.split()[0] for line, _ in zip(file, range(size))]


def stackoverflow_splits(root: str, decode: Decode, *, dataset: str) -> tuple[ClientReader, ClientReader, ClientReader]:
    """Stack Overflow's train, held-out and test splits (``stackoverflow.sqlite``, or TFF's HDF5 release)."""
    train, heldout, test = (
        tff_split(root, "stackoverflow.sqlite", split, f"stackoverflow_{h5}.h5", decode, dataset=dataset)
        for split, h5 in (("train", "train"), ("heldout", "held_out"), ("test", "test"))
    )
    return train, heldout, test


class TffEMNIST(NaturalDataModule):
    """TFF's federated EMNIST (``emnist_all.sqlite``): 3,400 writers, 62 classes (671,585 train and 77,483
    test samples), or with ``only_digits`` 3,383 writers of the 10 digits. Every writer has train and test samples.

    A sample is TFF's ``[1, 28, 28]`` float image as stored: ``1.0`` is the background and ``0.0`` the ink
    (the inverse of MNIST's convention); labels are ``0-9`` digits, ``10-35`` upper case, ``36-61`` lower case.

    Args:
        root: The folder holding ``emnist_all.sqlite``.
        only_digits: TFF's ``digits_only_train``/``digits_only_test`` splits instead of ``all_train``/``all_test``.
        **kwargs: :class:`~fl_lightning.data.natural.NaturalDataModule`'s (``val_fraction``, ``batch_size``, ...).
    """

    def __init__(self, root: str, *, only_digits: bool = False, **kwargs: Any) -> None:
        prefix, h5 = ("digits_only", "fed_emnist_digitsonly") if only_digits else ("all", "fed_emnist")
        self.num_classes = 10 if only_digits else 62
        train = tff_split(root, "emnist_all.sqlite", f"{prefix}_train", f"{h5}_train.h5", _emnist, dataset="TffEMNIST")
        test = tff_split(root, "emnist_all.sqlite", f"{prefix}_test", f"{h5}_test.h5", _emnist, dataset="TffEMNIST")
        super().__init__(train, test, **kwargs)


def _emnist(examples: list[dict[str, Any]]) -> tuple[Tensor, Tensor]:
    pixels = np.stack([e["pixels"] for e in examples]) if examples else np.zeros((0, 784), dtype=np.float32)
    return torch.from_numpy(pixels).reshape(-1, 1, 28, 28), torch.tensor([int(e["label"][0]) for e in examples])


#: TFF's Shakespeare characters (``char_prediction_preprocessing.CHAR_VOCAB``): character ``i`` is token ``i + 1``.
TFF_SHAKESPEARE_CHARS = 'dhlptx@DHLPTX $(,048cgkoswCGKOSW[_#\'/37;?bfjnrvzBFJNRVZ"&*.26:\naeimquyAEIMQUY]!%)-159\r'
_CHAR_TOKEN = np.full(256, len(TFF_SHAKESPEARE_CHARS) + 1, dtype=np.int64)  # every other byte: the OOV token
_CHAR_TOKEN[[ord(c) for c in TFF_SHAKESPEARE_CHARS]] = np.arange(1, len(TFF_SHAKESPEARE_CHARS) + 1)


class TffShakespeare(NaturalDataModule):
    """TFF's Shakespeare (``shakespeare.sqlite``): 715 speaking roles, next-character prediction.

    TFF's ``char_prediction_preprocessing``: each snippet's bytes become tokens (pad ``0``, the 86
    characters of :data:`TFF_SHAKESPEARE_CHARS` ``1-86``, any other byte OOV ``87``), framed by BOS ``88``
    and EOS ``89``, zero-padded to a multiple of ``sequence_length + 1`` and cut into chunks; a sample is
    one chunk, ``x = chunk[:-1]`` and ``y = chunk[1:]`` (``[sequence_length]`` each; 90 token values). A
    client's sample count is its number of chunks, so the index reads the (small) file once.

    Args:
        root: The folder holding ``shakespeare.sqlite``.
        sequence_length: Characters per sample (TFF and Reddi et al.: 80).
        **kwargs: :class:`~fl_lightning.data.natural.NaturalDataModule`'s.
    """

    num_classes = len(TFF_SHAKESPEARE_CHARS) + 4

    def __init__(self, root: str, *, sequence_length: int = 80, **kwargs: Any) -> None:
        self.sequence_length = check_int("sequence_length", sequence_length, minimum=1)
        train, test = (
            tff_split(
                root, "shakespeare.sqlite", split, f"shakespeare_{split}.h5", self._chunks,
                dataset="TffShakespeare", count=self._num_chunks,
            )  # fmt: skip
            for split in ("train", "test")
        )
        super().__init__(train, test, **kwargs)

    def _num_chunks(self, example: dict[str, Any]) -> int:
        return math.ceil((len(example["snippets"][0]) + 2) / (self.sequence_length + 1))

    def _chunks(self, examples: list[dict[str, Any]]) -> tuple[Tensor, Tensor]:
        bos, eos = len(TFF_SHAKESPEARE_CHARS) + 2, len(TFF_SHAKESPEARE_CHARS) + 3
        chunks = []
        for example in examples:
            tokens = np.concatenate([[bos], _CHAR_TOKEN[np.frombuffer(example["snippets"][0], dtype=np.uint8)], [eos]])
            padded = np.zeros(self._num_chunks(example) * (self.sequence_length + 1), dtype=np.int64)
            padded[: len(tokens)] = tokens
            chunks.append(padded.reshape(-1, self.sequence_length + 1))
        rows = torch.from_numpy(np.concatenate(chunks) if chunks else np.zeros((0, self.sequence_length + 1), dtype=np.int64))
        return rows[:, :-1], rows[:, 1:]


class TffStackOverflow(NaturalDataModule):
    """TFF's StackOverflow (``stackoverflow.sqlite``), next-word prediction: 342,477 train users (135,818,730
    posts), 38,758 held-out and 204,088 test users. The held-out split is the server's validation set.

    TFF's ``word_prediction_preprocessing``: a post's ``tokens`` split on ``' '``, the first ``sequence_length``
    words as ids (word ``i`` of the vocabulary ``i + 1``, any other word OOV ``V + 1``), EOS ``V + 3``
    appended if fewer than ``sequence_length``, BOS ``V + 2`` prepended, zero-padded to
    ``sequence_length + 1``; ``x = seq[:-1]``, ``y = seq[1:]``, ``V = vocab_size`` (``V + 4`` token values).
    The vocabulary is the first ``vocab_size`` words of TFF's ``stackoverflow.word_count`` (one
    ``word count`` a line, most frequent first), in ``root``.

    Args:
        root: The folder holding ``stackoverflow.sqlite`` and ``stackoverflow.word_count``.
        vocab_size: Words in the vocabulary (Reddi et al.: 10,000).
        sequence_length: Words per sample (Reddi et al.: 20).
        **kwargs: :class:`~fl_lightning.data.natural.NaturalDataModule`'s (not ``val``/``val_fraction``: the
            held-out split is the validation set).
    """

    def __init__(self, root: str, *, vocab_size: int = 10_000, sequence_length: int = 20, **kwargs: Any) -> None:
        self.vocab_size = check_int("vocab_size", vocab_size, minimum=1)
        self.sequence_length = check_int("sequence_length", sequence_length, minimum=1)
        self.vocab = stackoverflow_words(root, vocab_size, dataset="TffStackOverflow")
        self._word_id = {word: index + 1 for index, word in enumerate(self.vocab)}
        self.num_classes = len(self.vocab) + 4
        train, val, test = stackoverflow_splits(root, self._sequences, dataset="TffStackOverflow")
        super().__init__(train, test, val=val, **kwargs)

    def _sequences(self, examples: list[dict[str, Any]]) -> tuple[Tensor, Tensor]:
        length, oov = self.sequence_length, len(self.vocab) + 1
        rows = np.zeros((len(examples), length + 1), dtype=np.int64)
        for row, example in enumerate(examples):
            words = example["tokens"][0].decode("utf-8").split(" ")[:length]
            ids = [self._word_id.get(word, oov) for word in words] + ([oov + 2] if len(words) < length else [])
            rows[row, : len(ids) + 1] = [oov + 1, *ids]
        sequences = torch.from_numpy(rows)
        return sequences[:, :-1], sequences[:, 1:]


class TffCIFAR100(NaturalDataModule):
    """TFF's federated CIFAR-100 (``cifar100.sqlite``): 500 train clients and 100 test clients of 100 images each,
    partitioned by Pachinko allocation (per client, Dirichlet(0.1) over the coarse labels, then Dirichlet(10)
    over each coarse label's fine labels; TFF's ``cifar100.load_data``).

    A sample is the ``[3, 32, 32]`` image scaled to ``[0, 1]`` (TFF stores ``uint8`` HWC). The reference
    preprocessing of Reddi et al. and TFF (``build_image_map``: a 24x24 crop, random and maybe mirrored in
    training, central in test, then ``tf.image.per_image_standardization`` of each crop) draws a new crop
    every epoch, so it is the model's first step, not done here: :class:`~fl_lightning.models.ResNet18GN`
    (``crop=24``, ``standardize=True``, its defaults) applies it exactly; another model must apply it itself
    (:func:`~fl_lightning.data.augment.per_image_standardization` with ``scale=255`` after the crop). The test
    clients (ids ``0-99``) are other partitions than the training clients of the same ids, so a training
    client has no held-out data of its own.

    Args:
        root: The folder holding ``cifar100.sqlite``.
        label: ``"fine"`` (100 classes) or ``"coarse"`` (20).
        **kwargs: :class:`~fl_lightning.data.natural.NaturalDataModule`'s.
    """

    def __init__(self, root: str, *, label: Literal["fine", "coarse"] = "fine", **kwargs: Any) -> None:
        check_choice("label", label, ["fine", "coarse"])
        self.label_key = "label" if label == "fine" else "coarse_label"
        self.num_classes = 100 if label == "fine" else 20
        train, test = (
            tff_split(root, "cifar100.sqlite", split, f"fed_cifar100_{split}.h5", self._images, dataset="TffCIFAR100")
            for split in ("train", "test")
        )
        super().__init__(train, test, test_by_client=False, **kwargs)

    def _images(self, examples: list[dict[str, Any]]) -> tuple[Tensor, Tensor]:
        images = np.stack([e["image"] for e in examples]).astype(np.uint8) if examples else np.zeros((0, 3072), np.uint8)
        inputs = torch.from_numpy(images).reshape(-1, 32, 32, 3).permute(0, 3, 1, 2).float().div(255)
        return inputs, torch.tensor([int(e[self.label_key][0]) for e in examples], dtype=torch.int64)
