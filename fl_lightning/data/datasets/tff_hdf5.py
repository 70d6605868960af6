"""TensorFlow Federated's older HDF5 files, read one client at a time with ``h5py``.

Before its SQLite files, TFF published each dataset as ``<name>.tar.bz2`` of ``.h5`` files (TFF's
``HDF5ClientData``): a top-level group ``examples`` with one subgroup per client, named by its id, holding one
dataset per feature (``pixels``, ``label``, ``snippets``, ``tokens``, ...), all of the client's length. A client's
features are turned into the per-example records :func:`~fl_lightning.data.datasets.tf_example.parse_example`
gives, so every TFF dataset decodes both formats alike.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
from torch import Tensor

from fl_lightning.data.client_reader import IndexedReader
from fl_lightning.data.datasets.tff_sqlite import Count, Decode


def _h5py() -> Any:
    try:  # imported here: only TFF's HDF5 files need it (the ``datasets`` extra)
        import h5py
    except ImportError:
        raise ImportError("Reading TFF's HDF5 files needs h5py: pip install 'fl-lightning[datasets]'.") from None
    return h5py


class TffHdf5Reader(IndexedReader):
    """The clients of one TFF HDF5 file (one split), sorted by id.

    Args:
        path: The ``.h5`` file.
        decode: Turns one client's examples (as :func:`parse_example` records) into tensors.
        count: Samples per example, when an example is not one sample (the index then reads every client once).
    """

    def __init__(self, path: str | Path, decode: Decode, *, count: Count | None = None) -> None:
        self.path = Path(path)
        self.decode = decode
        self._file: Any = None
        self._pid = os.getpid()
        examples = self._examples()
        self._ids = sorted(examples.keys())
        # One dataset's length per client: the group's metadata, no sample is read.
        self._counts = np.fromiter(
            (len(next(iter(examples[client].values()))) for client in self._ids), dtype=np.int64, count=len(self._ids)
        )
        if count is not None:
            self._counts = np.array([sum(count(e) for e in self._records(p)) for p in range(len(self._ids))], dtype=np.int64)

    def read(self, position: int) -> tuple[Tensor, ...]:
        return self.decode(self._records(position))

    def _records(self, position: int) -> list[dict[str, Any]]:
        group = self._examples()[self._ids[position]]
        features = {name: group[name][()] for name in group}
        lengths = {len(values) for values in features.values()}
        if len(lengths) != 1:
            raise ValueError(f"{str(self.path)!r}: client {self._ids[position]!r} has features of lengths {sorted(lengths)}.")
        return [{name: _record_value(values[i]) for name, values in features.items()} for i in range(lengths.pop())]

    def _examples(self) -> Any:
        # Opened on first use in each process: an HDF5 handle must not cross a fork or a pickle.
        if self._file is None or self._pid != os.getpid():
            self._file = _h5py().File(self.path, "r")
            self._pid = os.getpid()
        if "examples" not in self._file:
            raise ValueError(f"{str(self.path)!r} is not a TFF HDF5 file: it has no 'examples' group.")
        return self._file["examples"]

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_file": None}


def _record_value(value: Any) -> Any:
    """One example's feature as :func:`parse_example` gives it: ``[bytes]``, or a flat int64/float32 array."""
    if isinstance(value, (bytes, str)):
        return [value.encode() if isinstance(value, str) else value]
    array = np.asarray(value)
    if array.dtype.kind in "iub":
        return array.reshape(-1).astype(np.int64)
    return array.reshape(-1).astype(np.float32)
