"""A client read from TFF's SQLite file with and without the ``examples(split_name, client_id)`` index (issue 40, item 6).

TFF's writer (``sql_client_data_utils``) creates the ``examples`` and ``client_metadata`` tables and no index
on ``examples``: without one, ``SELECT ... WHERE split_name = ? AND client_id = ?`` scans the whole table for
every client. This generates such a file (TFF's schema, ``--rows`` rows of ``--clients`` clients, one small
``tf.train.Example`` a row, clients written one after the other as TFF's writer does), then reads
``--reads`` clients through :class:`~fl_lightning.data.datasets.tff_sqlite.TffSqliteReader`: first with
``create_index=False`` (the file as TFF ships it: each read scans), then as the reader does by default (it
creates the index once, timed), side by side.

Run from the repository root::

    PYTHONPATH=. python benchmarks/tff_sqlite_index.py   # its section of benchmarks/results/datasets.md
"""

from __future__ import annotations

import argparse
import sqlite3
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch
from reporting import emit, header, load  # benchmarks/ is on sys.path when run as a script

MIB = 2**20


def generate(path: Path, rows: int, clients: int) -> None:
    """TFF's two tables, no index on ``examples`` (as TFF's writer leaves them)."""
    from fl_lightning.data.datasets.tf_example import example_message

    message = example_message()()
    message.features.feature["tokens"].bytes_list.value.append(b"w1 w2 w3 w4 w5 w6 w7 w8 w9 w10 w11 w12 w13 w14 w15")
    message.features.feature["label"].int64_list.value.append(3)
    blob = message.SerializeToString()
    per_client = np.full(clients, rows // clients)
    per_client[: rows % clients] += 1
    with sqlite3.connect(path) as db:
        db.executescript(
            """CREATE TABLE examples (split_name TEXT NOT NULL, client_id TEXT NOT NULL, serialized_example_proto BLOB NOT NULL);
               CREATE TABLE client_metadata (client_id TEXT NOT NULL, split_name TEXT NOT NULL, num_examples INTEGER NOT NULL);"""
        )
        ids = [f"f{c:06d}" for c in range(clients)]
        db.executemany("INSERT INTO examples VALUES ('train', ?, ?)", ((c, blob) for c, n in zip(ids, per_client) for _ in range(n)))
        db.executemany("INSERT INTO client_metadata VALUES (?, 'train', ?)", zip(ids, per_client.tolist()))
    db.close()


def read_times(path: Path, reads: int, *, create_index: bool) -> tuple[list[float], float | None]:
    from fl_lightning.data.datasets.tff_sqlite import TffSqliteReader

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the no-index warning is the point of the first run
        reader = TffSqliteReader(path, "train", lambda e: (torch.zeros(len(e)),), dataset="bench", create_index=create_index)
    positions = np.random.default_rng(0).choice(len(reader.client_ids), reads, replace=False)
    times = []
    for position in positions:
        started = time.perf_counter()
        (x,) = reader.read(int(position))
        times.append(time.perf_counter() - started)
        assert len(x) == reader.num_samples[position]
    return times, reader.index_seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_200_000)
    parser.add_argument("--clients", type=int, default=3_400)
    parser.add_argument("--reads", type=int, default=10)
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    started, load_before = time.perf_counter(), load()
    with tempfile.TemporaryDirectory(dir=args.workdir) as work:
        path = Path(work) / "emnist_like.sqlite"
        generate(path, args.rows, args.clients)
        size = path.stat().st_size / MIB
        before, _ = read_times(path, args.reads, create_index=False)
        after, index_seconds = read_times(path, args.reads, create_index=True)
        indexed_size = path.stat().st_size / MIB
    assert index_seconds is not None
    lines = [
        "## TFF SQLite: a client read without and with the (split_name, client_id) index (issue 40, item 6)",
        "",
        *header(started, load_before, threads=1),
        "",
        f"{args.rows:,} rows of {args.clients:,} clients ({args.rows // args.clients} rows a client), TFF's schema without "
        f"an index on `examples` ({size:.0f} MiB), {args.reads} random clients read through `TffSqliteReader`.",
        "",
        "| | per-client read, median (s) | min (s) | max (s) |",
        "|---|---:|---:|---:|",
        f"| before: no index (TFF's file; `create_index=False`) | {np.median(before):.4f} | {min(before):.4f} | {max(before):.4f} |",
        f"| after: the index the reader creates on first use | {np.median(after):.4f} | {min(after):.4f} | {max(after):.4f} |",
        "",
        f"- Creating the index once: {index_seconds:.1f} s; the file grew from {size:.0f} to {indexed_size:.0f} MiB.",
        f"- A client read is {np.median(before) / np.median(after):.0f}x faster; the index pays for itself after "
        f"{index_seconds / max(np.median(before) - np.median(after), 1e-9):.0f} client reads.",
        "",
    ]
    emit("\n".join(lines), args.out)


if __name__ == "__main__":
    main()
