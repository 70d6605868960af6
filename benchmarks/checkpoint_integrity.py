"""What checking a checkpoint whole costs (issue 39, items 7-8): ``CheckedCheckpointIO.load_checkpoint``, which
compares every zip member's CRC-32 before ``torch.load``, against ``torch.load`` alone on the same file, side by side.

Run: ``PYTHONPATH=. python benchmarks/checkpoint_integrity.py [--mib 64 256] [--repeats 5]``; results in
``benchmarks/results/checkpoint_integrity.md``.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch
from lightning.fabric.plugins import TorchCheckpointIO

from fl_lightning.checkpointing.checkpoint_io import CheckedCheckpointIO
from fl_lightning.checkpointing.integrity import integrity_problem


def checkpoint(mib: int) -> dict:
    """A Lightning-shaped checkpoint of ``mib`` MiB of float32 weights in 64 tensors."""
    per_tensor = mib * 2**20 // 4 // 64
    weights = {f"layer{i}.weight": torch.randn(per_tensor) for i in range(64)}
    return {"state_dict": weights, "pytorch-lightning_version": "2.6", "epoch": 0}


def best_of(repeats: int, work) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        work()
        times.append(time.perf_counter() - started)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mib", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    checked = CheckedCheckpointIO(TorchCheckpointIO())
    print("| checkpoint | torch.load | CRC check alone | checked load | checked / plain |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as folder:
        for mib in args.mib:
            path = Path(folder) / f"{mib}.ckpt"
            torch.save(checkpoint(mib), path)
            plain = best_of(args.repeats, lambda: torch.load(path, map_location="cpu", weights_only=True))
            crc = best_of(args.repeats, lambda: integrity_problem(path))
            full = best_of(args.repeats, lambda: checked.load_checkpoint(path, map_location="cpu", weights_only=True))
            print(f"| {mib} MiB | {plain * 1e3:.0f} ms | {crc * 1e3:.0f} ms | {full * 1e3:.0f} ms | {full / plain:.2f}x |")
            path.unlink()


if __name__ == "__main__":
    main()
