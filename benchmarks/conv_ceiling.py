"""How fast any client batching could make pfl-research's CIFAR-10 CNN on this CPU: an upper bound, measured.

Issue 41 asks the batched executor for >= 2x the plain loop at 10 clients per round and >= 4x at 50 on this CNN.
Batching clients can only save the per-operation cost of small batches: each client still owns its weights, so the
arithmetic per sample is the plain loop's. The most favourable case for batching is one set of weights shared by the
whole cohort: one SGD step of :class:`~fl_lightning.models.PflCNN` on a batch of ``10 x clients`` samples. Its time
per sample, against the plain loop's step on one client's batch of 10, is a ceiling no per-client-weights path
(vmap, grouped convolutions, per-client kernels) can pass on this machine. Beside it, the step's arithmetic rate in
GFLOP/s against a large float32 matrix product's (what this core sustains at best).

Run from the repository root::

    PYTHONPATH=. python benchmarks/conv_ceiling.py --out /tmp/conv_ceiling.md
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from reporting import emit, header, load  # benchmarks/ is on sys.path as a script
from torch import nn

from fl_lightning.models import PflCNN

BATCH = 10  # pfl-research's local batch size


def flops_per_sample(net: nn.Sequential, image: tuple[int, int, int]) -> float:
    """Multiply-adds x 2 of a forward pass on one image, x 3 for forward + backward (the first layer's input
    gradient, which nothing needs, is not computed by autograd and not counted)."""
    forward, first, x = 0.0, None, torch.zeros(1, *image)
    for layer in net:
        y = layer(x)
        if isinstance(layer, nn.Conv2d):
            flops = 2.0 * y.numel() * layer.in_channels * layer.kernel_size[0] * layer.kernel_size[1]
        elif isinstance(layer, nn.Linear):
            flops = 2.0 * layer.in_features * layer.out_features
        else:
            flops = 0.0
        forward += flops
        first = flops if first is None and flops else first
        x = y
    return 3 * forward - (first or 0.0)


def step_seconds(net: nn.Module, x: torch.Tensor, y: torch.Tensor, steps: int) -> float:
    """Process CPU seconds per SGD step on ``(x, y)`` (median of ``steps``, after one warm-up step)."""
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    times = []
    for i in range(steps + 1):
        t0 = time.process_time()
        opt.zero_grad()
        F.cross_entropy(net(x), y).backward()
        opt.step()
        if i:
            times.append(time.process_time() - t0)
    return statistics.median(times)


def matmul_gflops(n: int = 1024, repeats: int = 10) -> float:
    """The best float32 GFLOP/s of an ``n x n`` matrix product on this thread."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.process_time()
        a @ b
        best = min(best, time.process_time() - t0)
    return 2 * n**3 / best / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", default="10,50", help="cohort sizes whose shared-weights batch is timed")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per batch size and repeat")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", help="also write the Markdown report to this file")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    started, load_before = time.perf_counter(), load()
    net = PflCNN().net
    cohorts = [int(c) for c in args.clients.split(",")]
    per_sample = {1: [], **{c: [] for c in cohorts}}
    peaks = []
    for _ in range(args.repeats):  # the sizes interleaved, so a change in the machine's load hits each alike
        peaks.append(matmul_gflops())
        for clients in per_sample:
            n = BATCH * clients
            x, y = torch.randn(n, 3, 32, 32), torch.randint(0, 10, (n,))
            per_sample[clients].append(step_seconds(net, x, y, args.steps) / n)
    flops = flops_per_sample(net, (3, 32, 32))
    single = statistics.median(per_sample[1])
    lines = header(started, load_before, threads=1)
    lines += [
        f"- PflCNN, {sum(p.numel() for p in net.parameters()):,} parameters, {flops / 1e6:.1f} MFLOP per sample "
        f"(forward + backward); one SGD step, medians of {args.steps} steps x {args.repeats} repeats, process CPU time",
        f"- 1024 x 1024 float32 matrix product on this thread: {statistics.median(peaks):.1f} GFLOP/s (median of the repeats' best)",
        "",
        "| batch | clients' samples in it | ms per sample | GFLOP/s | per-sample speed over batch 10 (the ceiling) |",
        "|---:|---|---:|---:|---:|",
    ]
    for clients, times in per_sample.items():
        t = statistics.median(times)
        lines.append(
            f"| {BATCH * clients} | {clients} client(s) x {BATCH}, one shared set of weights | {t * 1e3:.3f} | "
            f"{flops / t / 1e9:.1f} | {single / t:.2f}x |"
        )
    emit("\n".join(lines), args.out)


if __name__ == "__main__":
    main()
