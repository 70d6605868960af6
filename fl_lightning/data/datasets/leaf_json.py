"""LEAF's JSON files, indexed once and read one user at a time.

LEAF's preprocessing (https://github.com/TalwalkarLab/leaf, ``preprocess.sh``) writes each split of a
dataset as ``data/<name>/data/<split>/*.json``, every file one object::

    {"users": [id, ...], "num_samples": [n, ...], "user_data": {id: {"x": [...], "y": [...]}, ...}}

(``train``/``test`` hold LEAF's standard split; ``all_data`` the unsplit users.) The index is the users,
their counts and the byte span of each user's ``{"x", "y"}`` value in its file: building it scans each
file once (FEMNIST's numbers are skipped, not parsed; other samples are decoded one user at a time and
dropped), and reading a user decodes that span alone.

A user's count is what the file holds, ``len(y)``, as LEAF's own client code counts
(``models/model.py``: ``len(data['y'])``), never the file's ``num_samples``: LEAF's ``split_data.py``
writes a Shakespeare test user's ``num_samples`` as its samples left after training
(``curr_num_samples - num_train_samples``) while its test windows start 79 later, at
``num_train_samples + 80 - 1``, so that list overstates every such user by 79.
"""

from __future__ import annotations

import json
import re
from array import array
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from torch import Tensor

from fl_lightning.data.client_reader import IndexedReader, missing_data_error

#: ``(x, y)`` lists of one user as LEAF stores them -> that user's tensors.
Decode = Callable[[list[Any], list[Any]], tuple[Tensor, ...]]

_SPACE = re.compile(r"[ \t\n\r]*")
# Skips a run of anything else (numbers, commas: consumed by the regex engine in one step), then
# captures a JSON string (whole, so brackets inside it do not count) or a bracket.
_STRUCTURE = re.compile(r'[^"\[\]{}]*("[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}])')
_DECODER = json.JSONDecoder()


class LeafJsonReader(IndexedReader):
    """The users of one LEAF split folder (``.../data/train``), sorted by id.

    Args:
        folder: The split's folder of ``*.json`` files.
        decode: Turns one user's ``x`` and ``y`` lists into tensors.
        dataset: The dataset's name, for errors.
        source: Where to get the files (a URL and the preprocessing command), for the missing-file error.
    """

    def __init__(self, folder: str | Path, decode: Decode, *, dataset: str, source: str) -> None:
        self.folder = Path(folder)
        self.decode = decode
        files = sorted(self.folder.glob("*.json")) if self.folder.is_dir() else []
        if not files:
            raise missing_data_error(dataset, self.folder / "*.json", source=source, folder=self.folder)
        self.files = files
        ids: list[str] = []
        counts, spans = [], []
        for number, path in enumerate(files):
            users, user_counts, user_spans = index_leaf_file(path)
            ids.extend(users)
            counts.append(user_counts)
            spans.append(np.column_stack([np.full(len(users), number, dtype=np.int64), user_spans]))
        # Arrays, not lists of Python ints and tuples: at 342,477 users those cost more than the index itself.
        order = np.argsort(np.asarray(ids, dtype=object), kind="stable")
        self._ids = [ids[i] for i in order]
        del ids
        for previous, current in zip(self._ids, self._ids[1:]):
            if previous == current:
                raise ValueError(f"{dataset}: user {current!r} appears in two files of {str(self.folder)!r}.")
        self._counts = np.concatenate(counts)[order]
        self._spans = np.concatenate(spans).reshape(-1, 3)[order]

    def read(self, position: int) -> tuple[Tensor, ...]:
        number, start, end = (int(v) for v in self._spans[position])
        with open(self.files[number], "rb") as file:
            file.seek(start)
            record = json.loads(file.read(end - start))
        x, y = record["x"], record["y"]
        if len(x) != len(y):
            raise ValueError(
                f"{str(self.files[number])!r}: user {self._ids[position]!r} has {len(x)} samples in 'x' but {len(y)} "
                "labels in 'y'; LEAF pairs x[i] with y[i], so this file was cut or edited after LEAF wrote it "
                "(rewrite it with LEAF's preprocess.sh)."
            )
        return self.decode(x, y)


def index_leaf_file(path: Path) -> tuple[list[str], np.ndarray, np.ndarray]:
    """``(users, counts, spans)`` of one LEAF JSON file, aligned with its ``users`` list: each user's ``len(y)``
    (what the file holds; its ``num_samples`` may overstate it, see the module's docstring) and the byte span
    ``[start, end)`` of its value in ``user_data`` (``int64`` arrays ``[n]`` and ``[n, 2]``); ``ValueError``
    naming the file if it breaks LEAF's schema.

    The file is read forward through a window of about :data:`WINDOW` bytes (more only while one value, a user
    or the ``users`` list, is larger): LEAF writes a split as one file (Shakespeare's train split: ~400 MB),
    and holding it whole, as bytes and as text, would double the index's memory for the time it is built."""
    top: dict[str, Any] = {}
    found = _Users()
    with open(path, "rb") as file:
        window = _Window(file)
        try:
            _, position = window.step(_open_object, 0)
            while window.step(_peek, position)[0] != "}":
                key, position = window.step(_key, position)
                if key == "user_data":
                    position = _index_users(window, position, found, top.get("users"))
                else:
                    top[key], position = window.step(_DECODER.raw_decode, position)
                    if key == "users" and isinstance(top[key], list):
                        top[key] = [_utf8(str(user)) for user in top[key]]
                _, position = window.step(_separator, position)
                window.forget(position)
        except (ValueError, IndexError) as error:
            raise ValueError(f"{str(path)!r} is not a LEAF JSON file: {error}") from None
    users, counts = top.get("users"), top.get("num_samples")
    if not isinstance(users, list) or not isinstance(counts, list) or len(users) != len(counts):
        raise ValueError(f"{str(path)!r} is not a LEAF JSON file: it needs equal-length 'users' and 'num_samples' lists.")
    rows = found.rows(users)
    if isinstance(rows, str):
        raise ValueError(f"{str(path)!r}: 'users' and 'user_data' disagree (e.g. user {rows!r}).")
    labels = np.frombuffer(found.counts, dtype=np.int64)[rows]
    if len(labels) and labels.min() < 0:
        raise ValueError(f"{str(path)!r} is not a LEAF JSON file: user {users[int(np.argmin(labels))]!r} has no 'y' list.")
    return users, labels, np.frombuffer(found.spans, dtype=np.int64).reshape(-1, 2)[rows]


class _Users:
    """What the index found in ``user_data``, compactly: spans and counts in arrays, and the names only where they
    are not the ``users`` list's, in its order (LEAF writes both in one order, so usually none)."""

    def __init__(self) -> None:
        self.spans, self.counts = array("q"), array("q")
        self.names: dict[int, str] = {}  # row -> name, where it is not users[row]

    def add(self, name: str, start: int, end: int, count: int, users: list[str] | None) -> None:
        row = len(self.counts)
        if users is None or row >= len(users) or users[row] != name:
            self.names[row] = name
        self.spans.extend((start, end))
        self.counts.append(count)

    def rows(self, users: list[str]) -> np.ndarray | str:
        """The row of each of ``users``, or the first name that is in one list and not the other (or twice in one)."""
        found = len(self.counts)
        if not self.names and found == len(users):
            return np.arange(found)
        names = [self.names[row] if row in self.names else users[row] for row in range(found)]
        position = {name: row for row, name in enumerate(names)}
        listed = set(users)
        odd = [user for user in users if user not in position] + [name for name in names if name not in listed]
        if odd or len(position) != found or len(listed) != len(users):
            return (odd or sorted(name for name in position if names.count(name) > 1 or users.count(name) > 1))[0]
        return np.asarray([position[user] for user in users], dtype=np.int64)


#: Bytes of a LEAF file the indexer holds at a time, at least (a larger user or ``users`` list: that much more).
WINDOW = 2 << 20


class _Window:
    """A file read forward as latin-1 text (one character a byte, so positions are byte offsets), of which only
    a window is held: :meth:`step` parses at an absolute position, reading on while the window ends inside
    what it parses; :meth:`forget` drops what lies before a position once the window holds enough of it."""

    def __init__(self, file: Any) -> None:
        self.file, self.text, self.base, self.eof = file, "", 0, False

    def step(self, parse: Callable[[str, int], tuple[Any, int]], position: int) -> tuple[Any, int]:
        """``parse(text, local) -> (value, local_end)`` at ``position``; ``(value, absolute end)``."""
        while True:
            try:
                value, end = parse(self.text, position - self.base)
                return value, end + self.base
            except (ValueError, IndexError):
                if self.eof:
                    raise
                self._read(max(WINDOW, len(self.text)))  # doubling: a value of n bytes costs O(n) rescanning

    def forget(self, position: int) -> None:
        """Drops the text before ``position`` once it is a window's worth, and keeps a window's worth ahead."""
        if position - self.base >= WINDOW:
            self.text, self.base = self.text[position - self.base :], position
        if not self.eof and len(self.text) - (position - self.base) < WINDOW // 2:
            self._read(WINDOW)

    def _read(self, size: int) -> None:
        data = self.file.read(size)
        self.eof = not data
        self.text += data.decode("latin-1")


def _utf8(value: str) -> str:
    """A string read through latin-1, as the UTF-8 it was written in (``\\uXXXX`` escapes are already decoded)."""
    if value.isascii():
        return value  # the same object: no copy of every id
    try:
        return value.encode("latin-1").decode("utf-8")
    except (UnicodeEncodeError, UnicodeDecodeError):
        return value


def _open_object(text: str, position: int) -> tuple[None, int]:
    return None, _expect(text, position, "{")


def _peek(text: str, position: int) -> tuple[str, int]:
    return text[position], position


def _key(text: str, position: int) -> tuple[Any, int]:
    """An object's key and the position after its colon."""
    key, position = _DECODER.raw_decode(text, position)
    return key, _expect(text, position, ":")


def _separator(text: str, position: int) -> tuple[None, int]:
    """The position after the spaces and the comma (if any) that follow a value; the next character must be there."""
    position = _SPACE.match(text, position).end()  # type: ignore[union-attr]
    if text[position] == ",":
        position = _SPACE.match(text, position + 1).end()  # type: ignore[union-attr]
        text[position]  # noqa: B018 (IndexError at the window's end: read on)
    return None, position


def _index_users(window: _Window, position: int, found: _Users, users: list[str] | None) -> int:
    """Records the span and the ``len(y)`` (``-1``: no ``y`` list) of each user's value in the ``user_data``
    object at ``position`` (``users``: the ``users`` list, where the file gave it first); returns the position after it."""
    _, position = window.step(_open_object, position)
    value_end: Callable[[str, int], tuple[int, int]] | None = None

    def user(text: str, local: int) -> tuple[tuple[Any, ...], int]:
        name, start = _key(text, local)
        if value_end is None:
            # The first user decides the scan: bracket matching where samples are numbers (FEMNIST: the regex
            # skips them unparsed, 2.4x faster), json's C scanner where they are strings (Shakespeare: 3x faster).
            value, end = _DECODER.raw_decode(text, start)
            scan, count = (_bracket_end if _numeric_samples(value) else _decoded_end), _label_count(value)
        else:
            (end, count), scan = value_end(text, start), value_end
        _, after = _separator(text, end)
        return (name, start, end, count, scan), after

    while window.step(_peek, position)[0] != "}":
        (name, start, end, count, value_end), after = window.step(user, position)
        # start and end are local to the window, whose base only forget() moves.
        found.add(_utf8(name), start + window.base, end + window.base, count, users)
        position = after
        window.forget(position)
    return position + 1


def _numeric_samples(value: Any) -> bool:
    """Whether a user's ``{"x": [...], ...}`` holds samples that are lists of numbers (FEMNIST's pixels)."""
    samples = value.get("x") if isinstance(value, dict) else None
    first = samples[0] if isinstance(samples, list) and samples else None
    return isinstance(first, list) and bool(first) and isinstance(first[0], (int, float))


def _label_count(value: Any) -> int:
    """``len(y)`` of a user's decoded ``{"x": [...], "y": [...]}``, or ``-1`` if it has no ``y`` list."""
    labels = value.get("y") if isinstance(value, dict) else None
    return len(labels) if isinstance(labels, list) else -1


def _decoded_end(text: str, start: int) -> tuple[int, int]:
    """The end and the ``len(y)`` of the user's value at ``start``, decoded (and dropped) by json's C scanner."""
    value, end = _DECODER.raw_decode(text, start)
    return end, _label_count(value)


def _bracket_end(text: str, start: int) -> tuple[int, int]:
    """The end and the ``len(y)`` of the user's object at ``start``, found by matching brackets outside
    strings: the numbers of ``x`` are skipped by the regular expression engine, never parsed (FEMNIST holds
    600 million of them); only the ``y`` list (one label a sample) is decoded."""
    if text[start] not in "[{":
        raise ValueError(f"expected an object at byte {start}, found {text[start]!r}")
    depth, count, position = 0, -1, start
    while (token := _STRUCTURE.match(text, position)) is not None:
        symbol, position = token.group(1), token.end()
        if symbol in ("[", "{"):
            depth += 1
        elif symbol in ("]", "}"):
            depth -= 1
            if depth == 0:
                return position, count
        elif depth == 1 and symbol == '"y"':  # the user's own key (its values are lists, never strings)
            labels, position = _DECODER.raw_decode(text, _expect(text, position, ":"))
            count = len(labels) if isinstance(labels, list) else -1
    raise ValueError(f"unterminated value at byte {start}")


def _expect(text: str, position: int, token: str) -> int:
    """The position after ``token`` (and the whitespace around it) at ``position``, or ``ValueError``."""
    position = _SPACE.match(text, position).end()  # type: ignore[union-attr]
    if text[position] != token:
        raise ValueError(f"expected {token!r} at byte {position}, found {text[position]!r}")
    return _SPACE.match(text, position + 1).end()  # type: ignore[union-attr]
