"""TensorFlow Federated's SQLite files, indexed by their ``client_metadata`` table and read one client at a time.

``tff.simulation.datasets`` publishes each dataset as ``<name>.sqlite.lzma``
(``https://storage.googleapis.com/tff-datasets-public/``); decompressed (``unxz``/``lzma -d``), it holds the
tables of TFF's ``sql_client_data_utils``::

    examples(split_name TEXT, client_id TEXT, serialized_example_proto BLOB)    -- one tf.train.Example a row
    client_metadata(client_id TEXT, split_name TEXT, num_examples INTEGER)

The client ids and counts come from ``client_metadata`` (one query); a client's rows are read through an
index on ``examples(split_name, client_id)``. TFF's writer creates none, and without it every client read
scans the whole table (0.4 s a client at 1.2 M rows, ~40x that at Stack Overflow's size), so the reader
creates it in the file on first use, once (``CREATE INDEX IF NOT EXISTS``, the one write fl_lightning makes
to a data file: seconds at 1 M rows, minutes at Stack Overflow's; ``benchmarks/RESULTS.md``); with
``create_index=False`` or a read-only file it warns once, naming the command that creates it.
"""

from __future__ import annotations

import os
import sqlite3
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from torch import Tensor

from fl_lightning.data.client_reader import IndexedReader, missing_data_error
from fl_lightning.data.datasets.tf_example import example_message, parse_example

#: One client's parsed ``tf.train.Example`` features, in row order -> that client's tensors.
Decode = Callable[[list[dict[str, Any]]], tuple[Tensor, ...]]
#: Samples one parsed example yields, where that is not one (e.g. Shakespeare's 81-character chunks).
Count = Callable[[dict[str, Any]], int]

TFF_URL = "https://storage.googleapis.com/tff-datasets-public"
#: The index a client read needs (TFF's writer creates none).
CLIENT_INDEX = "CREATE INDEX IF NOT EXISTS idx_examples_split_name_client_id ON examples (split_name, client_id)"
_WARNED: set[Path] = set()  # files warned about in this process: once each, not once per split


class TffSqliteReader(IndexedReader):
    """The clients of one split (``split_name``) of a TFF SQLite file, sorted by id.

    Args:
        path: The decompressed ``.sqlite`` file.
        split: Its ``split_name`` (``"train"``, ``"test"``, ``"heldout"``, ``"all_train"``, ...).
        decode: Turns one client's parsed examples into tensors.
        dataset: The dataset's name, for errors.
        count: Samples per example, when an example is not one sample. The counts then need every
            example's length, so the index reads the split once (only for small datasets: Shakespeare).
        create_index: Create the ``examples(split_name, client_id)`` index in the file if it has none (once;
            the file must be writable). ``False``: never write to the file, warn with the command instead.
    """

    def __init__(
        self,
        path: str | Path,
        split: str,
        decode: Decode,
        *,
        dataset: str,
        count: Count | None = None,
        create_index: bool = True,
    ) -> None:
        self.path = Path(path)
        self.split = split
        self.decode = decode
        if not self.path.is_file():
            source = f"{TFF_URL}/{self.path.name}.lzma (then: unxz {self.path.name}.lzma)"
            raise missing_data_error(dataset, self.path, source=source, folder=self.path.parent)
        example_message()  # fails now, naming the extra, if protobuf is missing
        self._connection: sqlite3.Connection | None = None
        self._pid = os.getpid()
        tables = {row[0] for row in self._query("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if not {"examples", "client_metadata"} <= tables:
            raise ValueError(f"{str(self.path)!r} is not a TFF SQLite file: it needs the tables examples and client_metadata.")
        self.create_index = create_index
        self.index_seconds: float | None = None  # how long creating the client index took, if this reader did
        self.indexed = self._has_client_index() or self._created_client_index()
        # Sorted here: SQLite would walk the client_id index and fetch every row at random.
        rows = sorted(self._query("SELECT client_id, num_examples FROM client_metadata WHERE split_name = ?", (split,)))
        if not rows:
            splits = sorted(row[0] for row in self._query("SELECT DISTINCT split_name FROM client_metadata"))
            raise ValueError(f"{str(self.path)!r} has no clients in split {split!r}; its splits are {splits}.")
        self._ids = [str(row[0]) for row in rows]
        if len(set(self._ids)) != len(self._ids):
            raise ValueError(f"{str(self.path)!r}: a client appears twice in client_metadata for split {split!r}.")
        self._counts = np.fromiter((row[1] for row in rows), dtype=np.int64, count=len(rows))
        if count is not None:
            self._counts = self._counted(count)

    def read(self, position: int) -> tuple[Tensor, ...]:
        rows = self._query(
            "SELECT serialized_example_proto FROM examples WHERE split_name = ? AND client_id = ? ORDER BY rowid",
            (self.split, self._ids[position]),
        )
        return self.decode([parse_example(row[0]) for row in rows])

    def _has_client_index(self) -> bool:
        """Whether an index of ``examples`` starts with ``(split_name, client_id)`` (or ``client_id, split_name``)."""
        for index in self._query("SELECT name FROM pragma_index_list('examples')"):
            columns = [row[0] for row in self._query("SELECT name FROM pragma_index_info(?) ORDER BY seqno", (index[0],))]
            if set(columns[:2]) == {"split_name", "client_id"}:
                return True
        return False

    def _created_client_index(self) -> bool:
        """Creates the client index in the file (once, whichever process comes first), or warns with the command."""
        command = f'sqlite3 {str(self.path)!r} "{CLIENT_INDEX};"'
        if self.create_index:
            started = time.perf_counter()
            try:
                # A writable connection of its own; a second process waits for the first one's index, then finds it.
                with sqlite3.connect(self.path, timeout=3600) as connection:
                    connection.execute(CLIENT_INDEX)
                connection.close()
            except sqlite3.Error as error:
                reason = f"creating it failed ({error})"
            else:
                self.index_seconds = time.perf_counter() - started
                self._connection = None  # the read-only connection reopens and sees the index
                return True
        else:
            reason = "create_index=False"
        if self.path.resolve() in _WARNED:
            return False
        _WARNED.add(self.path.resolve())
        warnings.warn(
            f"{str(self.path)!r} has no index on examples(split_name, client_id), so every client read scans the whole "
            f"table; {reason}. Create it once with: {command}",
            stacklevel=3,
        )
        return False

    def _counted(self, count: Count) -> np.ndarray:
        position = {client: index for index, client in enumerate(self._ids)}
        counts = np.zeros(len(self._ids), dtype=np.int64)
        for client, proto in self._query(
            "SELECT client_id, serialized_example_proto FROM examples WHERE split_name = ?", (self.split,)
        ):
            counts[position[client]] += count(parse_example(proto))
        return counts

    def _query(self, sql: str, parameters: tuple[Any, ...] = ()) -> list[Any]:
        # Opened on first use in each process: SQLite forbids using a connection across a fork, and a
        # connection cannot be pickled (DataLoader workers get the reader either way).
        if self._connection is None or self._pid != os.getpid():
            self._connection = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, check_same_thread=False)
            self._pid = os.getpid()
        return self._connection.execute(sql, parameters).fetchall()

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_connection": None}
