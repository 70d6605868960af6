"""Reading and writing partitions as JSON, so that runs can share the exact same split.

A partition file is UTF-8 JSON of this schema, which :func:`save_partition` writes and
:func:`load_partition` enforces::

    {"num_clients": 3, "clients": [[4, 0, 7], [1, 2], [3, 5, 6]]}

- The top level is an object with exactly two keys, ``num_clients`` and ``clients``.
- ``num_clients`` is a JSON integer: the length of ``clients``, and the datamodule's ``num_clients``.
- ``clients`` is a list holding one list per client, in client-id order.
- Every entry of a client's list is a JSON integer (not ``1.0``, ``true``, ``"1"``, ``null``,
  ``NaN`` or a list) in ``[0, num_samples)``, an index into the training set.
- No client is empty, and no index appears twice, in one client or in two. The order within a
  client is the order its samples are served in with ``FederatedDataModule(shuffle=False)``;
  otherwise clients' indices are loaded sorted.

A file that breaks any rule is refused with a ``ValueError`` naming the file, and the client
(its position in ``clients``) and the entry (its position in that client's list) at fault. So is a
path that is not a regular file (a folder, a FIFO that would block, a device such as ``/dev/zero``
that would be read until memory runs out), a file larger than any partition of the dataset could be
(:func:`max_partition_bytes`), and one that leaves out samples it must cover (``cover``).
"""

from __future__ import annotations

import json
import os
import stat
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fl_lightning.data._data_checks import check_partition, out_of_range

_KEYS = ("num_clients", "clients")
_EXAMPLE = '{"num_clients": n, "clients": [[...], ...]}'
#: Bytes an index may take in a partition file: its digits, a comma and generous indentation.
_BYTES_PER_INDEX = 64
#: Bytes a partition file may take beyond its indices: the keys, brackets and whitespace.
_BYTES_OVERHEAD = 64 * 1024


def max_partition_bytes(num_clients: int, num_samples: int) -> int:
    """The largest file a partition of ``num_samples`` samples over ``num_clients`` clients can be,
    even indented: anything larger is not one, and is not read to the end."""
    return _BYTES_PER_INDEX * (num_samples + num_clients) + _BYTES_OVERHEAD


def save_partition(parts: Sequence[np.ndarray], path: str | os.PathLike[str]) -> None:
    """Writes ``{"num_clients": n, "clients": [[indices], ...]}`` to ``path``.

    The file is written to a temporary name and renamed, so processes that save the same
    partition concurrently (one per rank) never leave a half-written file behind.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"num_clients": len(parts), "clients": [np.asarray(part).tolist() for part in parts]}
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(payload, separators=(",", ":")))
    os.replace(tmp, path)


def load_partition(
    path: str | os.PathLike[str],
    *,
    num_clients: int,
    num_samples: int,
    keep_order: bool = False,
    cover: np.ndarray | None = None,
) -> list[np.ndarray]:
    """Reads a partition file (see the module's schema) and validates it.

    Args:
        path: The JSON file.
        num_clients: The number of clients the file must hold.
        num_samples: Size of the dataset the indices refer to.
        keep_order: Keep each client's indices in the file's order instead of sorting them.
        cover: Indices that some client must hold, each (``None``: any subset is a partition).

    Returns:
        One ``int64`` index array per client, sorted unless ``keep_order``.

    Raises:
        ValueError: The path is not a regular file or is too large to be a partition; the file is
            not UTF-8 JSON, breaks the schema, has the wrong number of clients, an empty client, an
            index out of range or an index given twice, or leaves out an index of ``cover``. The
            message names the file, and the client and entry at fault.
    """
    source = f"partition file {str(path)!r}"
    payload = _read_json(Path(path), source, max_partition_bytes(num_clients, num_samples))
    if not isinstance(payload, dict):
        raise ValueError(f"{source} is not a partition: expected JSON {_EXAMPLE}, got {_describe(payload)}.")
    missing, unknown = [key for key in _KEYS if key not in payload], sorted(set(payload) - set(_KEYS))
    if missing or unknown:
        problems = [f"missing key {key!r}" for key in missing] + [f"unknown key {key!r}" for key in unknown]
        raise ValueError(f"{source} is not a partition: expected JSON {_EXAMPLE}; {', '.join(problems)}.")
    declared, clients = payload["num_clients"], payload["clients"]
    if type(declared) is not int:  # not `isinstance`: a bool is an int
        raise ValueError(f"{source}: num_clients must be a JSON integer, got {_show(declared)}.")
    if not isinstance(clients, list):
        raise ValueError(f"{source}: clients must be a list of lists of sample indices, got {_describe(clients)}.")
    if declared != len(clients):
        raise ValueError(f"{source} declares num_clients={declared} but lists {len(clients)} clients.")
    for cid, entries in enumerate(clients):
        _check_entries(entries, cid, num_samples, source)
    parts = check_partition(clients, num_clients=num_clients, num_samples=num_samples, source=source, sort=not keep_order)
    if cover is not None:
        missing = np.setdiff1d(cover, np.concatenate(parts))
        if missing.size:
            raise ValueError(
                f"{source} gives {missing.size} of the {len(cover)} samples it must cover to no client "
                f"(e.g. index {missing[0]}); FederatedDataModule(partial_partition=True) accepts that."
            )
    return parts


def _read_json(path: Path, source: str, max_bytes: int) -> Any:
    """The file's JSON value; one ``ValueError`` naming the file if it is not a regular file of at
    most ``max_bytes``, or not UTF-8 JSON."""
    data = _read_regular_file(path, source, max_bytes)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"{source} is not UTF-8 text: byte {err.start} is {data[err.start : err.start + 1]!r}.") from err
    try:
        return json.loads(text, object_pairs_hook=lambda pairs: _unique_keys(pairs, source))
    except json.JSONDecodeError as err:
        cut = " (the file looks truncated)" if err.pos >= len(text.rstrip()) else ""
        raise ValueError(f"{source} is not valid JSON{cut}: {err.msg} at line {err.lineno}, column {err.colno}.") from err
    except RecursionError as err:  # json's parser recurses once per nested list
        raise ValueError(f"{source} is not a partition: its JSON is nested too deeply.") from err


def _read_regular_file(path: Path, source: str, max_bytes: int) -> bytes:
    """At most ``max_bytes`` of ``path``, which must be a regular file. Opened without blocking and
    checked on the open descriptor: a FIFO's ``open`` would wait for a writer, a device never ends."""
    descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    mode = os.fstat(descriptor).st_mode
    if not stat.S_ISREG(mode):
        os.close(descriptor)
        kind = "a folder" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else "a device or socket"
        raise ValueError(f"{source} is {kind}, not a regular file.")
    with os.fdopen(descriptor, "rb") as file:
        data = file.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise ValueError(
            f"{source} is larger than {max_bytes} bytes, the most a partition of this dataset can take: it is not a partition."
        )
    return data


def _unique_keys(pairs: list[tuple[str, Any]], source: str) -> dict[str, Any]:
    """A JSON object as a dict; ``ValueError`` if a key repeats (``json`` would keep the last silently)."""
    payload = dict(pairs)
    if len(payload) != len(pairs):
        repeated = next(key for key, count in Counter(key for key, _ in pairs).items() if count > 1)
        raise ValueError(f"{source} is not a partition: key {repeated!r} appears twice.")
    return payload


def _check_entries(entries: Any, cid: int, num_samples: int, source: str) -> None:
    """Raises ``ValueError`` unless client ``cid``'s ``entries`` is a list of JSON integers in range."""
    if not isinstance(entries, list):
        raise ValueError(f"{source}: client {cid} must be a list of sample indices, got {_describe(entries)}.")
    # One pass over the entries; the common, valid case costs a type and a range check each.
    for position, entry in enumerate(entries):
        if type(entry) is not int:  # not `isinstance`: a bool is an int
            raise ValueError(
                f"{source}: client {cid} has {_show(entry)} at entry {position}; sample indices must be JSON integers."
            )
        if not 0 <= entry < num_samples:  # before NumPy, which overflows past int64
            raise out_of_range(source, cid, position, entry, num_samples)


def _describe(value: Any) -> str:
    """``value``'s JSON type and value, as in the file."""
    if value is None:
        return "null"
    kind = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", float: "a number", int: "an integer"}
    return f"{kind[type(value)]} {_show(value)}"


def _show(value: Any, limit: int = 60) -> str:
    """``value`` as JSON text, cut to ``limit`` characters."""
    text = json.dumps(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"
