"""Federated LoRA of a causal LM: ``FederatedTrainer`` next to a plain-PyTorch federated-LoRA loop, interleaved in one run.

The workload (issue 37): a GPT-2 built from a config (``--layers``, ``--width``, ``--vocab``), frozen, with
peft's LoRA adapters (``--rank``) on ``c_attn``, ``c_proj`` and ``c_fc``; 39 :class:`SyntheticTopicText`
writers as natural clients; FedAvg, ``--per-round`` clients a round, ``--steps`` local AdamW steps of
``--batch`` sequences. Dropout is 0 everywhere, so both ways are deterministic and comparable bit for bit.

(a) plain PyTorch: per client, the global adapter weights copied into the peft model (``copy_``), a fresh
    ``torch.optim.AdamW`` over the adapters, the same batches (``client_batches`` with the library's
    ``(seed, "client", round, client)`` generator), the next-token loss, ``delta = local - global`` of the
    adapters; the deltas averaged by sample count. It sends the adapter: its upload is the adapter's bytes.
(b) ``FederatedTrainer(client_executor="auto")`` (the lean executor after the run's first client) over
    :class:`~fl_lightning.models.LoRACausalLM`, all rounds in one ``fit``.

The repeats alternate which runs first. Reported: the median wall time of a round (first ``--warmup``
rounds of each run dropped; CPU time alongside) and the ratio (b)/(a) (goal <= 1.1x), upload bytes per
client of (b) (``fit_loop.total_upload_bytes``) against the adapter's bytes, and the max abs difference
of the final adapters. ``--profile`` adds a cProfile of (b)'s fit.

Run from the repository root::

    PYTHONPATH=. python benchmarks/llm_lora.py                 # ~2-3 min on 2 CPU cores
    PYTHONPATH=. python benchmarks/llm_lora.py --quick         # smoke run
    PYTHONPATH=. python benchmarks/llm_lora.py --profile --out report.md
"""

from __future__ import annotations

import argparse
import cProfile
import io
import logging
import pstats
import sys
import time
import warnings
from dataclasses import dataclass

import numpy as np
import torch
from harness import QUIET_TRAINER, RoundTimer, fedavg_round, max_abs_diff, now, select_clients  # benchmarks/ is on sys.path as a script
from reporting import emit, header, load
from torch import Tensor

from fl_lightning import FedAvg, FederatedTrainer
from fl_lightning.data import FederatedDataModule, Natural, SyntheticTopicText
from fl_lightning.models import LoRACausalLM
from fl_lightning.models.causal_lm import next_token_loss
from fl_lightning.utils.seeding import make_generator

SEED = 0
NUM_CLIENTS = 39
TARGETS = ["c_attn", "c_proj", "c_fc"]


@dataclass(frozen=True)
class Setup:
    layers: int
    width: int
    vocab: int
    seq_len: int
    rank: int
    per_round: int
    steps: int
    batch: int
    rounds: int
    warmup: int
    lr: float = 1e-3

    def module(self) -> LoRACausalLM:
        config = {
            "model_type": "gpt2", "vocab_size": self.vocab, "n_positions": self.seq_len, "n_embd": self.width,
            "n_layer": self.layers, "n_head": max(1, self.width // 64), "resid_pdrop": 0.0, "embd_pdrop": 0.0,
            "attn_pdrop": 0.0, "bos_token_id": 0, "eos_token_id": 0,
        }  # fmt: skip
        return LoRACausalLM(config=config, r=self.rank, lora_alpha=2.0 * self.rank, target_modules=TARGETS, lr=self.lr, seed=SEED)

    def datamodule(self) -> FederatedDataModule:
        text = SyntheticTopicText(num_clients=NUM_CLIENTS, vocab_size=self.vocab, seq_len=self.seq_len, seed=SEED)
        dm = FederatedDataModule(text, partitioner=Natural(), num_clients=NUM_CLIENTS, batch_size=self.batch, seed=SEED)
        dm.setup("fit")
        return dm


def adapters(module: LoRACausalLM) -> dict[str, Tensor]:
    """The trainable (adapter) parameters by name, live."""
    return {name: p for name, p in module.model.named_parameters() if p.requires_grad}


def run_plain(setup: Setup, dm: FederatedDataModule) -> tuple[np.ndarray, dict[str, Tensor], int]:
    """(a): (wall, CPU) seconds per round, the final global adapter, bytes uploaded per client."""
    module = setup.module()
    model, live = module.model.train(), adapters(module)
    global_state = {k: v.detach().clone() for k, v in live.items()}
    times = []
    for r in range(setup.rounds):
        t0 = now()

        def train_client(cid: int) -> int:
            optimizer = torch.optim.AdamW(live.values(), lr=setup.lr, weight_decay=0.0)
            batches = dm.client_batches(cid, generator=make_generator(SEED, "client", r, cid), num_batches=setup.steps)
            for ids, _ in batches:
                optimizer.zero_grad(set_to_none=True)
                next_token_loss(model(input_ids=ids, use_cache=False).logits, ids)[0].backward()
                optimizer.step()
            return dm.client_num_samples(cid)

        fedavg_round(live, global_state, select_clients(SEED, r, NUM_CLIENTS, setup.per_round), train_client)
        times.append(now() - t0)
    return np.stack(times), global_state, sum(v.numel() * v.element_size() for v in global_state.values())


def run_federated(setup: Setup, dm: FederatedDataModule, profile: cProfile.Profile | None = None) -> tuple[np.ndarray, dict[str, Tensor], float]:
    """(b): (wall, CPU) seconds per round, the final adapter, bytes uploaded per client."""
    module = setup.module()
    timer = RoundTimer()
    trainer = FederatedTrainer(
        algorithm=FedAvg(), client_executor="auto", local_steps=setup.steps, clients_per_round=setup.per_round, seed=SEED,
        max_epochs=setup.rounds, callbacks=[timer], accelerator="cpu", devices=1, **QUIET_TRAINER,
    )  # fmt: skip
    if profile is not None:
        profile.enable()
    trainer.fit(module, datamodule=dm)
    if profile is not None:
        profile.disable()
    per_client = trainer.fit_loop.total_upload_bytes / (setup.rounds * setup.per_round)
    state = {k: v.detach().clone() for k, v in adapters(module).items()}
    return np.diff(np.stack(timer.marks), axis=0), state, per_client


def render(setup: Setup, series: dict[str, list[np.ndarray]], bytes_: dict[str, float], diff: float, head: list[str]) -> str:
    module = setup.module()
    total = sum(p.numel() for p in module.parameters())
    adapter = sum(p.numel() for p in module.parameters() if p.requires_grad)
    lines = [
        "## Federated LoRA: FederatedTrainer vs a plain-PyTorch loop (issue 37)",
        "",
        *head,
        f"- workload: GPT-2 from a config ({setup.layers} layers, width {setup.width}, vocab {setup.vocab}, {total:,} "
        f"parameters), LoRA r={setup.rank} on {', '.join(TARGETS)} ({adapter:,} trainable); {NUM_CLIENTS} "
        f"SyntheticTopicText writers, {setup.per_round} per round, {setup.steps} AdamW steps of {setup.batch} x "
        f"{setup.seq_len} tokens; {setup.rounds} rounds per run, first {setup.warmup} dropped, "
        f"{len(series['plain'])} interleaved repeats",
        "",
        "| way | wall ms / round (median) | CPU ms / round (median) | vs plain (wall) | vs plain (CPU) | upload bytes / client |",
        "|---|---|---|---|---|---|",
    ]
    medians = {name: np.median(np.concatenate([t[setup.warmup :] for t in runs]), axis=0) * 1000 for name, runs in series.items()}
    for name, label in (("plain", "(a) plain PyTorch federated LoRA"), ("federated", "(b) FederatedTrainer, auto (lean)")):
        wall, cpu = medians[name]
        lines.append(
            f"| {label} | {wall:.1f} | {cpu:.1f} | {wall / medians['plain'][0]:.3f}x | {cpu / medians['plain'][1]:.3f}x "
            f"| {bytes_[name]:,.0f} |"
        )
    # Each repeat's pair ran back to back: their ratio is less exposed to the machine's load drifting over the run.
    paired = [
        np.median(f[setup.warmup :], axis=0) / np.median(p[setup.warmup :], axis=0)
        for f, p in zip(series["federated"], series["plain"])
    ]
    lines += [
        "",
        f"- adapter bytes: {bytes_['plain']:,.0f}; whole model: {total * 4:,} (float32). (b) uploads "
        f"{bytes_['federated'] / bytes_['plain']:.2f}x the adapter (goal ~1x once only trainable tensors are federated).",
        f"- final adapters, max abs difference (a) vs (b): {diff:.3g}",
        "- (b)/(a) per repeat, wall: " + ", ".join(f"{r[0]:.3f}x" for r in paired)
        + "; CPU: " + ", ".join(f"{r[1]:.3f}x" for r in paired),
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--vocab", type=int, default=256)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--per-round", type=int, default=4)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (0 keeps torch's default)")
    parser.add_argument("--quick", action="store_true", help="3 rounds, 1 repeat, 4 steps")
    parser.add_argument("--profile", action="store_true", help="also a cProfile of one FederatedTrainer run")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.repeats, args.steps = 3, 1, 4
    started, load_before = time.perf_counter(), load()
    if args.threads:
        torch.set_num_threads(args.threads)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    logging.getLogger("fl_lightning").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    setup = Setup(
        args.layers, args.width, args.vocab, args.seq_len, args.rank, args.per_round, args.steps, args.batch,
        args.rounds, args.warmup,
    )  # fmt: skip
    dm = setup.datamodule()
    series: dict[str, list[np.ndarray]] = {"plain": [], "federated": []}
    bytes_: dict[str, float] = {}
    finals: dict[str, dict[str, Tensor]] = {}
    for repeat in range(args.repeats):
        for name in ("plain", "federated") if repeat % 2 == 0 else ("federated", "plain"):
            times, finals[name], bytes_[name] = (run_plain if name == "plain" else run_federated)(setup, dm)
            series[name].append(times)
            print(f"repeat {repeat} {name}: median {np.median(times[setup.warmup:, 0]) * 1000:.1f} ms/round", file=sys.stderr)
    report = render(setup, series, bytes_, max_abs_diff(finals["plain"], finals["federated"]), header(started, load_before, threads=args.threads))
    if args.profile:
        profile = cProfile.Profile()
        run_federated(setup, dm, profile)
        out = io.StringIO()
        pstats.Stats(profile, stream=out).sort_stats("cumulative").print_stats(30)
        report += "\n### cProfile of (b), cumulative time\n\n```\n" + out.getvalue().strip() + "\n```\n"
    emit(report, args.out)


if __name__ == "__main__":
    main()
