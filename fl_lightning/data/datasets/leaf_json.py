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
        counts: list[int] = []
        spans: list[tuple[int, int, int]] = []
        for number, path in enumerate(files):
            users, num_samples, user_spans = index_leaf_file(path)
            ids.extend(users)
            counts.extend(num_samples)
            spans.extend((number, *user_spans[user]) for user in users)
        order = sorted(range(len(ids)), key=ids.__getitem__)
        self._ids = [ids[i] for i in order]
        for previous, current in zip(self._ids, self._ids[1:]):
            if previous == current:
                raise ValueError(f"{dataset}: user {current!r} appears in two files of {str(self.folder)!r}.")
        self._counts = np.asarray(counts, dtype=np.int64)[order]
        self._spans = np.asarray(spans, dtype=np.int64).reshape(-1, 3)[order]

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


def index_leaf_file(path: Path) -> tuple[list[str], list[int], dict[str, tuple[int, int]]]:
    """``(users, counts, {user: (start, end)})`` of one LEAF JSON file: each user's ``len(y)`` (what the file
    holds; its ``num_samples`` may overstate it, see the module's docstring) and the byte span of its value
    in ``user_data``; ``ValueError`` naming the file if it breaks LEAF's schema."""
    # latin-1 maps bytes one to one onto characters, so string offsets are byte offsets.
    text = path.read_bytes().decode("latin-1")
    top: dict[str, Any] = {}
    spans: dict[str, tuple[int, int]] = {}
    labels: dict[str, int] = {}
    try:
        position = _expect(text, 0, "{")
        while text[position] != "}":
            key, position = _DECODER.raw_decode(text, position)
            position = _expect(text, position, ":")
            if key == "user_data":
                position = _index_users(text, position, spans, labels)
            else:
                top[key], position = _DECODER.raw_decode(text, position)
            position = _SPACE.match(text, position).end()  # type: ignore[union-attr]
            if text[position] == ",":
                position = _SPACE.match(text, position + 1).end()  # type: ignore[union-attr]
    except (ValueError, IndexError) as error:
        raise ValueError(f"{str(path)!r} is not a LEAF JSON file: {error}") from None
    users, counts = top.get("users"), top.get("num_samples")
    if not isinstance(users, list) or not isinstance(counts, list) or len(users) != len(counts):
        raise ValueError(f"{str(path)!r} is not a LEAF JSON file: it needs equal-length 'users' and 'num_samples' lists.")
    users = [_utf8(str(user)) for user in users]
    missing = [user for user in users if user not in spans]
    if missing or len(spans) != len(users):
        raise ValueError(
            f"{str(path)!r}: 'users' and 'user_data' disagree (e.g. user {(missing or sorted(set(spans) - set(users)))[0]!r})."
        )
    unlabelled = [user for user in users if labels[user] < 0]
    if unlabelled:
        raise ValueError(f"{str(path)!r} is not a LEAF JSON file: user {unlabelled[0]!r} has no 'y' list.")
    return users, [labels[user] for user in users], spans


def _utf8(value: str) -> str:
    """A string read through latin-1, as the UTF-8 it was written in (``\\uXXXX`` escapes are already decoded)."""
    try:
        return value.encode("latin-1").decode("utf-8")
    except (UnicodeEncodeError, UnicodeDecodeError):
        return value


def _index_users(text: str, position: int, spans: dict[str, tuple[int, int]], labels: dict[str, int]) -> int:
    """Records the span and the ``len(y)`` (``-1``: no ``y`` list) of each user's value in the ``user_data``
    object at ``position``; returns the position after it."""
    position = _expect(text, position, "{")
    value_end: Callable[[str, int], tuple[int, int]] | None = None
    while text[position] != "}":
        user, position = _DECODER.raw_decode(text, position)
        start = _expect(text, position, ":")
        if value_end is None:
            # The first user decides the scan: bracket matching where samples are numbers (FEMNIST: the regex
            # skips them unparsed, 2.4x faster), json's C scanner where they are strings (Shakespeare: 3x faster).
            value, end = _DECODER.raw_decode(text, start)
            value_end = _bracket_end if _numeric_samples(value) else _decoded_end
            count = _label_count(value)
        else:
            end, count = value_end(text, start)
        spans[_utf8(user)] = (start, end)
        labels[_utf8(user)] = count
        position = _SPACE.match(text, end).end()  # type: ignore[union-attr]
        if text[position] == ",":
            position = _SPACE.match(text, position + 1).end()  # type: ignore[union-attr]
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
