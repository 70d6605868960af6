"""The reader interface of naturally partitioned sources, and the lazy datasets built on it.

A :class:`ClientReader` is one split (train, test, held-out) of a source whose clients come from the
data itself (a writer, a speaker, a user). It knows its clients and their sample counts from an
index, and reads one client's samples only when asked: a population of 100,000+ clients costs an
index, never its samples.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from torch import Tensor
from torch.utils.data import Dataset

from fl_lightning.data._data_checks import check_int
from fl_lightning.utils.init_args import RecordsInitArgs


class ClientReader(RecordsInitArgs, ABC):
    """One split of a naturally partitioned source: its clients, their sample counts, their samples on demand.

    Its constructor arguments (a path, a split) are logged with the data module's, as every configurable
    piece's are (:class:`~fl_lightning.utils.init_args.RecordsInitArgs`). Implement :attr:`client_ids` (the order defines client positions), :attr:`num_samples` (aligned
    with it, from an index: reading samples to count them defeats the purpose) and :meth:`read`.
    """

    @property
    @abstractmethod
    def client_ids(self) -> Sequence[str]:
        """The source's ids of the clients of this split, in position order."""

    @property
    @abstractmethod
    def num_samples(self) -> np.ndarray:
        """Number of samples of each client (``int64``, aligned with :attr:`client_ids`)."""

    @abstractmethod
    def read(self, position: int) -> tuple[Tensor, ...]:
        """The samples of the client at ``position``: tensors of equal first dimension, usually ``(x, y)``."""


class IndexedReader(ClientReader):
    """A reader whose constructor builds its index into ``_ids`` (client ids, in position order) and
    ``_counts`` (``int64`` sample counts aligned with them), as the file-format readers do."""

    _ids: list[str]
    _counts: np.ndarray

    @property
    def client_ids(self) -> Sequence[str]:
        return self._ids

    @property
    def num_samples(self) -> np.ndarray:
        return self._counts


def missing_data_error(dataset: str, path: str | Path, *, source: str, folder: str | Path) -> FileNotFoundError:
    """The one error for a dataset whose files are absent: nothing is ever downloaded behind the user's back."""
    return FileNotFoundError(
        f"{dataset}: {str(path)!r} does not exist. fl_lightning never downloads data; get it from {source} and put "
        f"it in {str(folder)!r} (docs/datasets.md)."
    )


def check_read(reader: ClientReader, position: int, tensors: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
    """``tensors``, or ``ValueError`` if their length is not the client's indexed count (a corrupt or mixed-up file)."""
    expected = int(reader.num_samples[position])
    lengths = {len(t) for t in tensors}
    if lengths != {expected}:
        raise ValueError(
            f"{type(reader).__name__}: client {reader.client_ids[position]!r} has {sorted(lengths)} samples, but "
            f"its index says {expected}: the index is built once, when the data module is, so either the files "
            f"changed since (build the data module again) or {type(reader).__name__} decodes another number of "
            "samples than it indexes (a bug in that reader: please report it)."
        )
    return tensors


class ClientSamples(Dataset[tuple[Tensor, ...]]):
    """The samples of one client of ``reader`` as a dataset, read on first access (its length comes from the index)."""

    def __init__(self, reader: ClientReader, position: int) -> None:
        self.reader = reader
        self.position = check_int("position", position, minimum=0)
        self._tensors: tuple[Tensor, ...] | None = None

    @property
    def tensors(self) -> tuple[Tensor, ...]:
        """The client's tensors (read now if not yet), which :func:`~fl_lightning.data.client_batches` slices directly."""
        if self._tensors is None:
            self._tensors = check_read(self.reader, self.position, self.reader.read(self.position))
        return self._tensors

    def __getitem__(self, index: int) -> tuple[Tensor, ...]:
        return tuple(t[index] for t in self.tensors)

    def __len__(self) -> int:
        return int(self.reader.num_samples[self.position])


class PooledClients(Dataset[tuple[Tensor, ...]]):
    """All clients of ``reader`` end to end (client by client, in position order), read one client at a time.

    Meant for sequential passes (the server's validation and test loaders): each client is read
    once per pass and only the current one is kept.
    """

    def __init__(self, reader: ClientReader) -> None:
        self.reader = reader
        self.offsets = np.concatenate([[0], np.cumsum(reader.num_samples, dtype=np.int64)])
        self._current: ClientSamples | None = None

    def __getitem__(self, index: int) -> tuple[Tensor, ...]:
        if not 0 <= index < len(self):
            raise IndexError(f"sample {index} is outside [0, {len(self)}).")
        position = int(np.searchsorted(self.offsets, index, side="right")) - 1
        if self._current is None or self._current.position != position:
            self._current = ClientSamples(self.reader, position)
        return self._current[index - int(self.offsets[position])]

    def __len__(self) -> int:
        return int(self.offsets[-1])


class ClientFraction(ClientReader):
    """Each client of ``reader`` split in two from ``seed``: the ``held`` part (``fraction`` of its samples,
    rounded, at least one and never all; none for a one-sample client) or the rest.

    The split is drawn per client from ``(seed, position)``, so a client's part is known without reading any other.
    """

    # Entropy appended to the seed so this split is independent of every other draw from the same seed.
    _STREAM = 3

    def __init__(self, reader: ClientReader, fraction: float, seed: int, *, held: bool) -> None:
        self.reader, self.fraction, self.seed, self.held = reader, fraction, seed, held
        counts = reader.num_samples
        # min(n - 1, max(1, round(f n))), and 0 for an empty client.
        self.num_held = np.maximum(0, np.minimum(counts - 1, np.maximum(1, np.round(fraction * counts)))).astype(np.int64)
        self._counts = self.num_held if held else counts - self.num_held

    @property
    def client_ids(self) -> Sequence[str]:
        return self.reader.client_ids

    @property
    def num_samples(self) -> np.ndarray:
        return self._counts

    def read(self, position: int) -> tuple[Tensor, ...]:
        tensors = check_read(self.reader, position, self.reader.read(position))
        order = np.random.default_rng([self.seed, self._STREAM, position]).permutation(len(tensors[0]))
        cut = int(self.num_held[position])
        chosen = np.sort(order[:cut] if self.held else order[cut:])
        return tuple(t[chosen] for t in tensors)
