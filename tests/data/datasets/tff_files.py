"""Writes TFF's SQLite files for tests: the schema of TFF's ``sql_client_data_utils`` and ``tf.train.Example``
records encoded byte by byte from the protobuf wire format (independent of the ``protobuf`` package the
library parses them with)."""

from __future__ import annotations

import json
import sqlite3
import struct
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

Feature = Sequence[float] | Sequence[int] | Sequence[bytes] | np.ndarray


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # negative int64s as two's complement, as protobuf does
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (wire type 2)."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def encode_example(features: Mapping[str, Feature]) -> bytes:
    """``tf.train.Example``: floats as a packed ``FloatList`` (2), ints as a packed ``Int64List`` (3), bytes as ``BytesList`` (1)."""
    entries = b""
    for key, values in features.items():
        values = list(values)
        if values and isinstance(values[0], bytes):
            feature = _field(1, b"".join(_field(1, v) for v in values))
        elif values and isinstance(values[0], (float, np.floating)):
            feature = _field(2, _field(1, struct.pack(f"<{len(values)}f", *values)))
        else:
            feature = _field(3, _field(1, b"".join(_varint(int(v)) for v in values)))
        entries += _field(1, _field(1, key.encode()) + _field(2, feature))
    return _field(1, entries)


def write_tff_sqlite(path: Path, clients: Mapping[str, Mapping[str, Sequence[Mapping[str, Feature]]]]) -> None:
    """``clients[split][client_id]`` = that client's examples, in TFF's two tables (with TFF's indices)."""
    with sqlite3.connect(path) as connection:
        connection.executescript(
            """CREATE TABLE examples (split_name TEXT NOT NULL, client_id TEXT NOT NULL,
                                      serialized_example_proto BLOB NOT NULL);
               CREATE INDEX idx_examples_client_id ON examples (client_id);
               CREATE INDEX idx_examples_client_id_split ON examples (split_name, client_id);
               CREATE TABLE client_metadata (client_id TEXT NOT NULL, split_name TEXT NOT NULL, num_examples INTEGER NOT NULL);
               CREATE INDEX idx_metadata_client_id ON client_metadata (client_id);"""
        )
        for split, by_client in clients.items():
            for client, examples in by_client.items():
                connection.executemany(
                    "INSERT INTO examples VALUES (?, ?, ?)", [(split, client, encode_example(e)) for e in examples]
                )
                connection.execute("INSERT INTO client_metadata VALUES (?, ?, ?)", (client, split, len(examples)))
    connection.close()


def write_tff_hdf5(path: Path, clients: Mapping[str, Mapping[str, np.ndarray | list[bytes]]]) -> None:
    """TFF's ``HDF5ClientData`` layout: ``examples/<client_id>/<feature>``, one dataset per feature holding the
    client's examples stacked (``pixels`` ``[n, 28, 28]``, ``label`` ``[n]``; bytes as variable-length strings)."""
    import h5py

    with h5py.File(path, "w") as file:
        examples = file.create_group("examples")
        for client, features in clients.items():
            group = examples.create_group(client)
            for name, values in features.items():
                if isinstance(values, list):
                    group.create_dataset(name, data=values, dtype=h5py.string_dtype("ascii"))
                else:
                    group.create_dataset(name, data=values)


def write_stackoverflow_counts(root: Path, words: Mapping[str, int], tags: Mapping[str, int]) -> None:
    """TFF's ``stackoverflow.word_count`` (``word count`` a line, in the given order) and
    ``stackoverflow.tag_count`` (one JSON object ``{tag: count}``, in the given order)."""
    (root / "stackoverflow.word_count").write_text("".join(f"{w} {c}\n" for w, c in words.items()))
    (root / "stackoverflow.tag_count").write_text(json.dumps(dict(tags)))
