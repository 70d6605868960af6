"""What a SCAFFOLD round holds per sampled client until its aggregation: live tensors against anonymous memory.

``benchmarks/results/client_store.md`` ("Where the peak is") saw about two entry-sized buffers per sampled client
during a round, one of them the :math:`\\Delta y_i` SCAFFOLD aggregates (Algorithm 1, lines 16–17). This counts, after
the round's first and last client, the distinct storages of every live tensor of at least 100 kB (``gc``) and the
anonymous resident memory (``RssAnon``): when the growth of the live storages equals the growth of ``RssAnon``,
nothing else (no hidden buffer) is held, and any excess under glibc's default is its heap keeping freed blocks.
Run it under both allocator settings::

    PYTHONPATH=. python benchmarks/scaffold_round_buffers.py
    MALLOC_MMAP_THRESHOLD_=131072 PYTHONPATH=. python benchmarks/scaffold_round_buffers.py
"""

from __future__ import annotations

import argparse
import gc
import os

import lightning.pytorch as pl
import torch
from client_store_memory import rss_parts  # benchmarks/ is on sys.path when run as a script
from scaffold_budget import CLASSES, FEATURES, MIB, federation

from fl_lightning import SCAFFOLD, FederatedCallback, FederatedTrainer
from fl_lightning.models import MLP


def live_storages() -> tuple[int, int]:
    """How many distinct storages the live tensors of at least 100 kB use, and their bytes."""
    storages = {}
    for obj in gc.get_objects():
        if isinstance(obj, torch.Tensor) and obj.numel() * obj.element_size() >= 100_000:
            storage = obj.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
    return len(storages), sum(storages.values())


class Probe(FederatedCallback):
    """Prints the live storages and ``RssAnon`` after each round's first and last client."""

    def __init__(self, per_round: int) -> None:
        self.per_round, self.count = per_round, 0

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.count = 0

    def on_client_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, client: object, update: object) -> None:
        self.count += 1
        if self.count in (1, self.per_round):
            n, size = live_storages()
            print(
                f"| {trainer.current_epoch} | {self.count} | {n} | {size / MIB:.1f} | {rss_parts()[0] / MIB:.1f} |", flush=True
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=400)
    parser.add_argument("--per-round", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--budget", default="4MB")
    args = parser.parse_args()
    torch.set_num_threads(1)
    data = federation(args.clients)
    torch.manual_seed(0)
    trainer = FederatedTrainer(
        algorithm=SCAFFOLD(), clients_per_round=args.per_round, local_steps=1, max_epochs=args.rounds,
        client_state_memory=args.budget, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0, callbacks=[Probe(args.per_round)],
    )  # fmt: skip
    print(f"MALLOC_MMAP_THRESHOLD_={os.environ.get('MALLOC_MMAP_THRESHOLD_', '(glibc default)')}")
    print("| round | after client | live storages ≥ 100 kB | their MiB | RssAnon MiB |\n|---:|---:|---:|---:|---:|")
    trainer.fit(MLP(in_features=FEATURES, hidden=(), num_classes=CLASSES, lr=0.05), datamodule=data)


if __name__ == "__main__":
    main()
