"""Fault injection: malformed partition files are refused with one error naming the file, client and entry."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from fl_lightning.data import FederatedDataModule, InMemoryDataset
from fl_lightning.data.partition_io import load_partition, max_partition_bytes, save_partition

NUM_SAMPLES = 12
TRAIN = InMemoryDataset(
    inputs=torch.arange(float(NUM_SAMPLES)).unsqueeze(1), labels=torch.arange(NUM_SAMPLES) % 3, num_classes=3
)
GOOD = [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10, 11]]


def clients(client: int, entries: object) -> str:
    """A valid 4-client file whose client ``client`` is replaced by ``entries`` (raw JSON text)."""
    texts = [json.dumps(part) for part in GOOD]
    texts[client] = str(entries)
    return '{"num_clients": 4, "clients": [' + ", ".join(texts) + "]}"


# (file text, what the message must say after naming the file); every client/entry is a position.
BAD_FILES = {
    "clients as a dict": (
        '{"num_clients": 4, "clients": {"0": [0], "1": [1], "2": [2], "3": [3]}}',
        r"clients must be a list of lists of sample indices, got an object",
    ),
    "float index": (clients(2, "[6, 7.0, 8]"), r"client 2 has 7\.0 at entry 1; sample indices must be JSON integers"),
    "string index": (clients(1, '[3, "4", 5]'), r'client 1 has "4" at entry 1'),
    "bool index": (clients(0, "[0, true, 2]"), r"client 0 has true at entry 1"),
    "scalar client": (clients(3, "9"), r"client 3 must be a list of sample indices, got an integer 9"),
    "NaN index": (clients(1, "[3, NaN, 5]"), r"client 1 has NaN at entry 1"),
    "null index": (clients(2, "[null]"), r"client 2 has null at entry 0"),
    "null client": (clients(2, "null"), r"client 2 must be a list of sample indices, got null"),
    "nested list": (clients(0, "[0, [1, 2]]"), r"client 0 has \[1, 2\] at entry 1"),
    "index beyond int64": (clients(3, f"[9, 10, {2**70}]"), rf"client 3 has index {2**70} outside \[0, 12\) at entry 2"),
    "negative index": (clients(1, "[3, -4, 5]"), r"client 1 has index -4 outside \[0, 12\) at entry 1"),
    "index out of range": (clients(2, "[6, 7, 12]"), r"client 2 has index 12 outside \[0, 12\) at entry 2"),
    "index in two clients": (
        clients(3, "[9, 10, 4]"),
        r"index 4 is assigned to more than one client: client 1 \(entry 1\) and client 3 \(entry 2\)",
    ),
    "index twice in a client": (clients(2, "[6, 8, 7, 8]"), r"client 2 has index 8 twice, at entries 1 and 3"),
    "empty client": (clients(1, "[]"), r"left client 1 empty"),
    "truncated JSON": (clients(0, "[0, 1, 2]")[:40], r"is not valid JSON \(the file looks truncated\): .* at line 1, column 4\d"),
    "empty file": ("", r"is not valid JSON \(the file looks truncated\)"),
    "top level a list": (json.dumps(GOOD), r"is not a partition: expected JSON .*, got a list \[\["),
    "missing num_clients": (json.dumps({"clients": GOOD}), r"is not a partition: .*; missing key 'num_clients'"),
    "unknown key": (json.dumps({"num_clients": 4, "clients": GOOD, "seed": 0}), r"unknown key 'seed'"),
    "repeated key": ('{"num_clients": 4, "clients": [[0]], "clients": ' + json.dumps(GOOD) + "}", "key 'clients' appears twice"),
    "float num_clients": (json.dumps({"num_clients": 4.0, "clients": GOOD}), r"num_clients must be a JSON integer, got 4\.0"),
    "num_clients disagrees": (json.dumps({"num_clients": 5, "clients": GOOD}), r"declares num_clients=5 but lists 4 clients"),
    "wrong client count": (json.dumps({"num_clients": 3, "clients": GOOD[:3]}), r"has 3 clients but num_clients=4"),
}


@pytest.mark.parametrize(("text", "expected"), BAD_FILES.values(), ids=BAD_FILES.keys())
def test_a_bad_partition_file_is_refused_naming_the_file_client_and_entry(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "partition.json"
    path.write_text(text)
    data = FederatedDataModule(TRAIN, num_clients=4, partition_file=str(path))
    with pytest.raises(ValueError) as raised:
        data.setup("fit")
    message = str(raised.value)
    assert message.startswith(f"partition file {str(path)!r}")
    assert re.search(expected, message), message
    assert message.count("\n") == 0  # one line, not a traceback of the parser


def test_non_utf8_bytes_are_refused_naming_the_file_and_byte(tmp_path: Path) -> None:
    path = tmp_path / "partition.json"
    path.write_bytes(clients(0, "[0, 1, 2]").encode()[:30] + b"\xff\xfe" + b"]]}")
    with pytest.raises(ValueError, match=rf"^partition file {re.escape(repr(str(path)))} is not UTF-8 text: byte 30 is b'\\xff'"):
        load_partition(path, num_clients=4, num_samples=NUM_SAMPLES)


def test_what_the_writer_writes_is_valid_and_read_back_sorted(tmp_path: Path) -> None:
    parts = [np.array([2, 0, 1]), np.array([5, 3, 4]), np.arange(6, 9), np.arange(9, 12)]
    save_partition(parts, tmp_path / "p.json")
    loaded = load_partition(tmp_path / "p.json", num_clients=4, num_samples=NUM_SAMPLES)
    assert [part.tolist() for part in loaded] == GOOD and {part.dtype for part in loaded} == {np.dtype(np.int64)}


@pytest.mark.parametrize("kind", ["folder", "FIFO", "device"])
def test_a_path_that_is_not_a_regular_file_is_refused_without_reading_it(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "partition.json"
    if kind == "folder":
        path.mkdir()
    elif kind == "FIFO":
        os.mkfifo(path)  # an open for reading would block until a writer came
    else:
        path = Path("/dev/zero")  # would be read until memory runs out
    expected = {"folder": "a folder", "FIFO": "a FIFO", "device": "a device or socket"}[kind]
    with pytest.raises(ValueError, match=rf"^partition file '{re.escape(str(path))}' is {expected}, not a regular file\.$"):
        load_partition(path, num_clients=4, num_samples=NUM_SAMPLES)


def test_a_file_larger_than_any_partition_is_refused_unread(tmp_path: Path) -> None:
    limit = max_partition_bytes(4, NUM_SAMPLES)
    assert len(json.dumps({"num_clients": 4, "clients": GOOD}, indent=40)) < limit  # even indented, a partition fits
    path = tmp_path / "huge.json"
    path.write_text(" " * limit + json.dumps({"num_clients": 4, "clients": GOOD}))
    with pytest.raises(ValueError, match=rf"is larger than {limit} bytes, the most a partition of this dataset can take"):
        load_partition(path, num_clients=4, num_samples=NUM_SAMPLES)


def test_a_partial_cover_is_refused_unless_allowed(tmp_path: Path) -> None:
    path = tmp_path / "partial.json"
    path.write_text(json.dumps({"num_clients": 4, "clients": [[0, 1], [3, 4, 5], [6, 7, 8], [9, 10, 11]]}))
    with pytest.raises(ValueError, match=r"gives 1 of the 12 samples it must cover to no client \(e\.g\. index 2\); "
                       r"FederatedDataModule\(partial_partition=True\) accepts that\.$"):
        FederatedDataModule(TRAIN, num_clients=4, partition_file=str(path)).setup("fit")
    allowed = FederatedDataModule(TRAIN, num_clients=4, partition_file=str(path), partial_partition=True)
    allowed.setup("fit")
    assert [allowed.client_num_samples(c) for c in range(4)] == [2, 3, 3, 3]


def test_the_validation_split_need_not_be_covered(tmp_path: Path) -> None:
    data = FederatedDataModule(TRAIN, num_clients=2, val_fraction=0.25, partition_file=str(tmp_path / "p.json"))
    data.setup("fit")  # writes the partition of the 9 training samples
    again = FederatedDataModule(TRAIN, num_clients=2, val_fraction=0.25, partition_file=str(tmp_path / "p.json"))
    again.setup("fit")  # reads it back: the 3 validation samples are no client's
    assert sum(again.client_num_samples(c) for c in range(2)) == NUM_SAMPLES - 3
