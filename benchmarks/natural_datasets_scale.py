"""Natural partitions at StackOverflow's scale: start-up, one round and peak memory, 1,000 vs 100,000+ clients.

A population of ``N`` users is generated in two real formats, then loaded by the library's own loaders:

- ``tff``: TFF's StackOverflow SQLite file (``stackoverflow.sqlite``: TFF's ``examples`` and
  ``client_metadata`` tables, plus the ``(split_name, client_id)`` index TFF's writer omits and the reader
  would otherwise create on first use: ``tff_sqlite_index.py`` times that), one ``tf.train.Example`` per post with ``tokens``/``title``/``tags``;
  ``--posts`` posts per training user, a tenth of the users in ``heldout`` and 60 % in ``test`` with one
  post each; a 10,000-word ``stackoverflow.word_count``), read by :class:`~fl_lightning.data.TffStackOverflow`;
- ``leaf``: LEAF's Shakespeare JSON in LEAF's real layout: one file per split, as ``split_data.py`` writes it
  (``data/train/all_data_niid_1_keep_0_train_9.json`` and its ``test`` twin, ``--posts`` 80-character windows
  per user in train, one in test), read by :class:`~fl_lightning.data.LeafShakespeare`.

For each format and ``N`` a fresh subprocess imports the library, constructs the data module (the index:
ids and counts; no sample read), and trains one FedAvg round of ``--per-round`` clients (one local epoch,
a small embedding model) through ``FederatedTrainer``. Measured: the construction time, the round's time
(``fit`` of one round, set-up included), the RSS after import, after construction and the peak
(``ru_maxrss``) at the end of construction and of the round. The claims checked: memory flat in the number of
clients, i.e. the index costs a few hundred bytes per client and nothing else grows with ``N``; and building the
index holds little more than the index (``construct peak / index``), even from one large file.

Run from the repository root::

    PYTHONPATH=. python benchmarks/natural_datasets_scale.py --out benchmarks/results/datasets.md
    PYTHONPATH=. python benchmarks/natural_datasets_scale.py --clients 1000,5000 --formats tff   # quick
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from reporting import emit, header, load  # benchmarks/ is on sys.path when run as a script

MIB = 2**20
VOCAB = 10_000
SHAKESPEARE = "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"


def current_rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def generate_tff(folder: Path, num_clients: int, posts: int, rng: np.random.Generator) -> None:
    """TFF's StackOverflow layout with ``num_clients`` training users."""
    from fl_lightning.data.datasets.tf_example import example_message

    folder.mkdir(parents=True, exist_ok=True)
    words = [f"w{i}" for i in range(VOCAB)]
    (folder / "stackoverflow.word_count").write_text("".join(f"{w} {VOCAB - i}\n" for i, w in enumerate(words)))
    example = example_message()

    def proto() -> bytes:
        message = example()
        features = message.features.feature
        features["tokens"].bytes_list.value.append(" ".join(rng.choice(words, 15)).encode())
        features["title"].bytes_list.value.append(b"a title")
        features["tags"].bytes_list.value.append(b"python|sqlite")
        return message.SerializeToString()

    blobs = [proto() for _ in range(64)]  # a pool of distinct posts: generation time is not what is measured
    with sqlite3.connect(folder / "stackoverflow.sqlite") as db:
        db.executescript(
            """CREATE TABLE examples (split_name TEXT NOT NULL, client_id TEXT NOT NULL, serialized_example_proto BLOB NOT NULL);
               CREATE TABLE client_metadata (client_id TEXT NOT NULL, split_name TEXT NOT NULL, num_examples INTEGER NOT NULL);"""
        )
        for split, share, per_user in (("train", 1.0, posts), ("heldout", 0.1, 1), ("test", 0.6, 1)):
            users = [f"{u:08d}" for u in range(int(num_clients * share))]
            db.executemany(
                "INSERT INTO examples VALUES (?, ?, ?)",
                ((split, u, blobs[(i + k) % len(blobs)]) for i, u in enumerate(users) for k in range(per_user)),
            )
            db.executemany("INSERT INTO client_metadata VALUES (?, ?, ?)", ((u, split, per_user) for u in users))
        db.executescript(
            """CREATE INDEX idx_examples_client_id ON examples (client_id);
               CREATE INDEX idx_examples_client_id_split ON examples (split_name, client_id);
               CREATE INDEX idx_metadata_client_id ON client_metadata (client_id);"""
        )


def generate_leaf(folder: Path, num_clients: int, posts: int, rng: np.random.Generator) -> None:
    """LEAF's Shakespeare layout with ``num_clients`` roles: one file per split, as LEAF's ``split_data.py`` writes."""
    text = "".join(rng.choice(list(SHAKESPEARE), 4096))
    for split, per_user in (("train", posts), ("test", 1)):
        out = folder / "data" / split
        out.mkdir(parents=True, exist_ok=True)
        users = {}
        for u in range(num_clients):
            offsets = rng.integers(0, len(text) - 81, per_user)
            users[f"ROLE_{u:08d}"] = {"x": [text[o : o + 80] for o in offsets], "y": [text[o + 80] for o in offsets]}
        record = {"users": list(users), "num_samples": [per_user] * len(users), "user_data": users}
        with open(out / f"all_data_niid_1_keep_0_{split}_9.json", "w") as file:
            json.dump(record, file)


def child(args: argparse.Namespace) -> dict[str, Any]:
    """One format and population, in this fresh process: import, construct, one round."""
    import torch
    import torch.nn.functional as F
    from lightning.pytorch import LightningModule

    from fl_lightning import FederatedTrainer
    from fl_lightning.data import LeafShakespeare, TffStackOverflow

    class TinyLM(LightningModule):
        """Embedding and a linear read-out: next token at every position (StackOverflow) or after the window (LEAF)."""

        def __init__(self, vocab: int) -> None:
            super().__init__()
            self.embed, self.out = torch.nn.Embedding(vocab, 16), torch.nn.Linear(16, vocab)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            logits = self.out(self.embed(x))
            if y.ndim == 1:
                logits = logits[:, -1]
            return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    torch.set_num_threads(1)
    rss_import = current_rss()
    started = time.perf_counter()
    if args.format == "tff":
        data = TffStackOverflow(args.root, batch_size=16)
    else:
        data = LeafShakespeare(args.root, batch_size=16)
    construct = time.perf_counter() - started
    rss_construct, peak_construct = current_rss(), peak_rss()
    torch.manual_seed(0)
    trainer = FederatedTrainer(
        clients_per_round=args.per_round, local_epochs=1, max_epochs=1, limit_val_batches=0, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
    )  # fmt: skip
    started = time.perf_counter()
    trainer.fit(TinyLM(int(data.num_classes)), datamodule=data)
    round_seconds = time.perf_counter() - started
    return {
        "clients": data.num_clients,
        "construct": construct,
        "round": round_seconds,
        "rss_import": rss_import,
        "rss_construct": rss_construct,
        "peak_construct": peak_construct,
        "peak": peak_rss(),
    }


def run(args: argparse.Namespace, fmt: str, num_clients: int, root: Path) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", "--format", fmt, "--root", str(root), "--per-round", str(args.per_round)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        raise RuntimeError(f"{fmt} with {num_clients} clients failed:\n{done.stderr[-3000:]}")
    files = [p.stat().st_size for p in root.rglob("*") if p.is_file()]
    return {**json.loads(lines[-1]), "file_mib": sum(files) / MIB, "largest_mib": max(files) / MIB}


def render(results: dict[str, list[dict[str, Any]]], head: list[str], per_round: int) -> str:
    out = [
        "## Natural partitions at scale: 1,000 vs 100,000+ clients (issue 29, item 5)",
        "",
        *head,
        "",
        f"One FedAvg round of {per_round} clients, one local epoch, after constructing the data module from the files.",
        "",
        "| format | clients | files (MiB) | largest file (MiB) | construct (s) | one round (s) | RSS after import (MiB) | "
        "RSS after construct (MiB) | construct peak (MiB) | construct peak / index | peak RSS (MiB) | index bytes / client |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    notes = []
    for fmt, runs in results.items():
        for r in runs:
            index = r["rss_construct"] - r["rss_import"]
            cells = [
                fmt, f"{r['clients']:,}", f"{r['file_mib']:.1f}", f"{r['largest_mib']:.1f}", f"{r['construct']:.2f}",
                f"{r['round']:.2f}", f"{r['rss_import'] / MIB:.0f}", f"{r['rss_construct'] / MIB:.0f}",
                f"{r['peak_construct'] / MIB:.0f}", f"{(r['peak_construct'] - r['rss_import']) / max(index, 1):.2f}",
                f"{r['peak'] / MIB:.0f}", f"{index / r['clients']:.0f}",
            ]  # fmt: skip
            out.append("| " + " | ".join(cells) + " |")
        small, large = runs[0], runs[-1]
        growth = (large["peak"] - small["peak"]) / MIB
        notes.append(
            f"- {fmt}: {large['clients']:,} / {small['clients']:,} clients: construction "
            f"{large['construct'] / small['construct']:.1f}x, round {large['round'] / small['round']:.2f}x, peak RSS "
            f"+{growth:.0f} MiB ({(large['peak'] - small['peak']) / (large['clients'] - small['clients']):.0f} bytes per "
            f"added client), file {large['file_mib'] / small['file_mib']:.0f}x."
        )
    return "\n".join([*out, "", *notes, ""])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", default="1000,100000", help="comma-separated populations")
    parser.add_argument("--formats", default="tff,leaf")
    parser.add_argument("--posts", type=int, default=3, help="training samples per client")
    parser.add_argument("--per-round", type=int, default=10)
    parser.add_argument("--workdir", default=None, help="where to generate the files (default: a temporary folder)")
    parser.add_argument("--out", default=None)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--format", help=argparse.SUPPRESS)
    parser.add_argument("--root", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args)))
        return
    started, load_before = time.perf_counter(), load()
    results: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(dir=args.workdir) as work:
        for fmt in args.formats.split(","):
            for n in (int(c) for c in args.clients.split(",")):
                root = Path(work) / f"{fmt}_{n}"
                (generate_tff if fmt == "tff" else generate_leaf)(root, n, args.posts, np.random.default_rng(n))
                results.setdefault(fmt, []).append(run(args, fmt, n, root))
                print(f"{fmt} {n}: {results[fmt][-1]}", file=sys.stderr)
    emit(render(results, header(started, load_before, threads=1), args.per_round), args.out)


if __name__ == "__main__":
    main()
