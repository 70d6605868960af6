"""What the speed and memory benchmarks share: clocks, a round timer, quiet Trainer settings, the plain FedAvg loop.

The plain loop is the reference every speed benchmark compares ``FederatedTrainer`` with: per
client ``param.copy_`` of the global weights, a fresh ``torch.optim.SGD``, the local steps on
batches cut by the library's rule (see :func:`fl_lightning.data.client_batches`), ``delta =
local - global``; then the sample-weighted FedAvg of the deltas. It selects the same clients
and draws the same data order as ``FederatedTrainer(seed=seed)``, so both end with the same
weights.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fl_lightning.utils.seeding import derive_seed, make_generator

CLOCKS = ("wall", "cpu")
#: Trainer arguments that keep a benchmark's Trainer from logging, checkpointing or printing.
QUIET_VALIDATING = {
    "logger": False,
    "enable_checkpointing": False,
    "enable_progress_bar": False,
    "enable_model_summary": False,
    "num_sanity_val_steps": 0,
}
#: The same, and no validation either.
QUIET_TRAINER = {**QUIET_VALIDATING, "limit_val_batches": 0}


def on_device(device: torch.device) -> dict[str, Any]:
    """The Trainer arguments that train on ``device`` (one CUDA device, or the CPU)."""
    return {"accelerator": "gpu" if device.type == "cuda" else "cpu", "devices": 1}


def max_abs_diff(a: Mapping[str, Tensor], b: Mapping[str, Tensor]) -> float:
    """The largest absolute difference between two state dicts' tensors, wherever each lives."""
    return max(float((a[k].float().cpu() - b[k].float().cpu()).abs().max()) for k in a)


def now() -> np.ndarray:
    """(wall seconds, CPU seconds of this process): CPU time is not inflated while other processes run.

    Waits for queued CUDA work first (when CUDA is in use), so that a GPU's asynchronous
    kernels are charged to the interval that launched them. ``is_initialized`` alone: ``is_available`` loads NVML
    each call (~0.5 ms, which would land inside every timed round).
    """
    if torch.cuda.is_initialized():
        torch.cuda.synchronize()
    return np.array([time.perf_counter(), time.process_time()])


class RoundTimer(pl.Callback):
    """Clocks at each round (epoch) start and at the end of training."""

    def __init__(self) -> None:
        self.marks: list[np.ndarray] = []

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.marks.append(now())

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.marks.append(now())


def select_clients(seed: int, round_idx: int, num_clients: int, clients_per_round: int) -> list[int]:
    """The clients of a round, by the same rule as ``Algorithm.select_clients``."""
    order = torch.randperm(num_clients, generator=make_generator(seed, "select", round_idx))
    return sorted(order[:clients_per_round].tolist())


def fedavg_round(
    live: Mapping[str, Tensor], global_state: dict[str, Tensor], clients: Sequence[int], train_client: Callable[[int], int]
) -> None:
    """One round of FedAvg over ``live`` (the federated tensors), ``global_state`` updated in place: per client,
    the global values copied into ``live``, ``train_client(cid)`` (returns the client's sample count), its
    delta ``live - global`` weighted by that count; then the weighted mean of the deltas added to the global values."""
    acc = {k: torch.zeros_like(v) for k, v in global_state.items()}
    total = 0.0
    for cid in clients:
        with torch.no_grad():
            for k, p in live.items():
                p.copy_(global_state[k])
        n = train_client(cid)
        with torch.no_grad():
            for k, p in live.items():
                acc[k].add_(p - global_state[k], alpha=float(n))
        total += n
    with torch.no_grad():
        for k, v in global_state.items():
            v.add_(acc[k].div_(total))


def plain_fedavg(
    net: nn.Module,
    inputs: Tensor,
    labels: Tensor,
    client_idx: Sequence[Tensor],
    select: Callable[[int], Sequence[int]],
    *,
    steps: int | None,
    rounds: int,
    lr: float,
    batch_size: int,
    seed: int,
) -> tuple[np.ndarray, dict[str, Tensor]]:
    """``rounds`` rounds of FedAvg on ``net`` (trained in place, starting from its current weights).

    Args:
        net: the model; its ``state_dict`` is the global model.
        inputs: every sample's features (on the model's device, or on the CPU).
        labels: every sample's class.
        client_idx: each client's dataset indices (int64, CPU).
        select: round -> the round's clients.
        steps: local SGD steps per client (epochs of fresh permutations, last batch partial);
            ``None``: one epoch per client, as ``FederatedTrainer(local_epochs=1)``.
        rounds: number of rounds.
        lr: local learning rate (plain SGD, no momentum).
        batch_size: local batch size.
        seed: root seed of the clients' data order (as ``FederatedTrainer(seed=...)``).

    Returns:
        The (wall, CPU) seconds of every round (``[rounds, 2]``) and the final global weights.
    """
    device = next(net.parameters()).device
    live = dict(net.state_dict(keep_vars=True))
    global_state = {k: v.detach().clone() for k, v in live.items()}
    times = []
    for r in range(rounds):
        t0 = now()

        def train_client(cid: int) -> int:
            opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.0)
            idx = client_idx[cid]
            n = len(idx)
            g = torch.Generator().manual_seed(derive_seed(seed, "client", r, cid))
            done, client_steps = 0, -(-n // batch_size) if steps is None else steps
            while done < client_steps:  # epochs of fresh permutations, cut into batches, last one partial
                order = torch.randperm(n, generator=g)
                for start in range(0, n, batch_size):
                    b = idx[order[start : start + batch_size]]
                    x, y = inputs[b].to(device), labels[b].to(device)  # no-ops for data on the device
                    opt.zero_grad()
                    F.cross_entropy(net(x), y).backward()
                    opt.step()
                    done += 1
                    if done == client_steps:
                        break
            return n

        fedavg_round(live, global_state, select(r), train_client)
        times.append(now() - t0)
    with torch.no_grad():
        for k, p in live.items():
            p.copy_(global_state[k])
    return np.stack(times), global_state


def vmap_fedavg(
    net: nn.Module,
    inputs: Tensor,
    labels: Tensor,
    client_idx: Sequence[Tensor],
    select: Callable[[int], Sequence[int]],
    *,
    steps: int,
    rounds: int,
    lr: float,
    batch_size: int,
    seed: int,
    compile: bool = False,
) -> tuple[np.ndarray, dict[str, Tensor]]:
    """The hand-written ``torch.func`` loop of issue 30, the batched executor's yardstick: per round,
    the clients' parameters stacked, ``steps`` steps of ``vmap(grad_and_value(functional_call))``
    (``torch.compile``-d with ``compile``) and a plain SGD update, the deltas averaged by sample
    count. The same batches as :func:`plain_fedavg`; clients of one size, ``steps`` full batches
    within one epoch (pfl-research's CIFAR-10 set-up). Same arguments and returns as :func:`plain_fedavg`."""
    device = next(net.parameters()).device
    global_state = {k: v.detach().clone() for k, v in net.state_dict().items()}
    names = [name for name, _ in net.named_parameters()]
    buffers = {k: v for k, v in global_state.items() if k not in names}

    def loss(params: dict[str, Tensor], x: Tensor, y: Tensor) -> Tensor:
        return F.cross_entropy(torch.func.functional_call(net, {**params, **buffers}, (x,)), y)

    grad_step = torch.func.vmap(torch.func.grad_and_value(loss), randomness="different")
    if compile:
        grad_step = torch.compile(grad_step)
    times = []
    for r in range(rounds):
        t0 = now()
        ids = list(select(r))
        orders = []
        for cid in ids:
            idx = client_idx[cid]
            if len(idx) < steps * batch_size or len(idx) != len(client_idx[ids[0]]):
                raise ValueError(f"vmap_fedavg needs clients of one size with {steps} full batches; client {cid} has {len(idx)}.")
            g = torch.Generator().manual_seed(derive_seed(seed, "client", r, cid))
            orders.append(idx[torch.randperm(len(idx), generator=g)])
        order = torch.stack(orders)
        params = {k: global_state[k].unsqueeze(0).repeat(len(ids), *(1,) * global_state[k].dim()) for k in names}
        for step in range(steps):
            b = order[:, step * batch_size : (step + 1) * batch_size]
            grads, _ = grad_step(params, inputs[b].to(device), labels[b].to(device))
            with torch.no_grad():
                for k in names:
                    params[k].add_(grads[k], alpha=-lr)
        with torch.no_grad():
            for k in names:
                global_state[k].add_((params[k] - global_state[k]).mean(0))  # equal sample counts: FedAvg's weights
        times.append(now() - t0)
    return np.stack(times), global_state
