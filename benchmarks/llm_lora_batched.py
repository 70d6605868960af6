"""Many LoRA adapters over one frozen base: the batched executor against the lean one, clients per second at 8, 32
and 128 clients per round, interleaved in one run (issue 41).

The workload is ``configs/llm/lora_tiny_gpt2.yaml``'s: a GPT-2 built from a config (2 layers, width 64, 2 heads,
vocab 64, 32 positions; dropout 0 so that the ways are comparable), peft's LoRA r=8 on ``c_attn``, ``c_proj`` and
``c_fc``, AdamW lr 0.01; :class:`SyntheticTopicText` writers (as many as the largest cohort) as natural clients,
``--steps`` local steps of 8 sequences; FedAvg. Per cohort size, three ways, in rotating order:

(a) ``client_executor="lean"`` (what ``auto`` picks);
(b) ``client_executor="batched"``: the adapters stacked, the frozen base once, attention folded over the clients;
(c) (b) with ``vmap``'s per-client fallback for attention (``folded_attention`` switched off): what (b) was before.

Reported: the median clients/s over the rounds after the first (wall clock; CPU alongside), each way's ratio to
(a), the max abs difference of the final adapters (b) vs (a), and the memory the batched group stacks at 32
clients (the stacked state's bytes) against stacking every tensor of the module.

Run from the repository root::

    PYTHONPATH=. python benchmarks/llm_lora_batched.py            # ~3-4 min on 2 CPU cores
    PYTHONPATH=. python benchmarks/llm_lora_batched.py --quick    # smoke run
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
import time
import warnings

import numpy as np
import torch
from harness import QUIET_TRAINER, RoundTimer, max_abs_diff  # benchmarks/ is on sys.path as a script
from reporting import emit, header, load

from fl_lightning import FedAvg, FederatedTrainer
from fl_lightning.data import FederatedDataModule, Natural, SyntheticTopicText
from fl_lightning.loops import batched_sgd
from fl_lightning.mixins.applied_term import attribute_set
from fl_lightning.models import LoRACausalLM

SEED = 0
CONFIG = {
    "model_type": "gpt2", "vocab_size": 64, "n_positions": 32, "n_embd": 64, "n_layer": 2, "n_head": 2,
    "bos_token_id": 0, "eos_token_id": 0, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0,
}  # fmt: skip
WAYS = {"lean": "(a) lean", "batched": "(b) batched", "fallback": "(c) batched, attention per client (vmap fallback)"}


def module() -> LoRACausalLM:
    return LoRACausalLM(config=CONFIG, r=8, lora_alpha=16, target_modules=["c_attn", "c_proj", "c_fc"], lr=0.01, seed=SEED)


def datamodule(num_clients: int) -> FederatedDataModule:
    text = SyntheticTopicText(num_clients=num_clients, vocab_size=64, seq_len=32, seed=SEED)
    dm = FederatedDataModule(text, partitioner=Natural(), num_clients=num_clients, batch_size=8, seed=SEED)
    dm.setup("fit")
    return dm


def run(way: str, dm: FederatedDataModule, per_round: int, steps: int, rounds: int) -> tuple[np.ndarray, dict]:
    """Seconds (wall, CPU) per round of one fit, and the final adapters."""
    model, timer = module(), RoundTimer()
    trainer = FederatedTrainer(
        algorithm=FedAvg(), client_executor="lean" if way == "lean" else "batched", local_steps=steps,
        clients_per_round=per_round, seed=SEED, max_epochs=rounds, callbacks=[timer], accelerator="cpu", devices=1,
        **QUIET_TRAINER,
    )  # fmt: skip
    fallback = way == "fallback"
    with contextlib.ExitStack() as stack:
        if fallback:  # the step looks the context manager up in its module when it runs
            stack.enter_context(attribute_set(batched_sgd, "folded_attention", contextlib.nullcontext))
        trainer.fit(model, datamodule=dm)
    adapters = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    return np.diff(np.stack(timer.marks), axis=0), adapters


def stacked_bytes(dm: FederatedDataModule, clients: int) -> tuple[int, int, int]:
    """The largest group the batched executor forms in a round of ``clients`` (1 step; the fit's first client trains
    alone, measuring its activations for the default group size), the bytes it stacks for that group, and what
    stacking every tensor of the module for as many clients would take."""
    states: list[batched_sgd.StackedState] = []
    init = batched_sgd.StackedState.__init__

    def recording(self: batched_sgd.StackedState, *args: object, **kwargs: object) -> None:
        init(self, *args, **kwargs)
        states.append(self)

    with attribute_set(batched_sgd.StackedState, "__init__", recording):
        run("batched", dm, clients, 1, 1)
    largest = max(states, key=lambda state: next(iter(state.by_name.values())).shape[0])
    group = next(iter(largest.by_name.values())).shape[0]
    unique = {id(t): t for t in largest.by_name.values()}.values()
    every = {id(t): t for t in module().state_dict(keep_vars=True).values()}.values()
    return group, sum(t.numel() * t.element_size() for t in unique), group * sum(t.numel() * t.element_size() for t in every)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cohorts", type=int, nargs="+", default=[8, 32, 128])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3, help="per fit; the first is dropped")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="cohorts 8 and 32, 2 steps, 2 rounds")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    if args.quick:
        args.cohorts, args.steps, args.rounds = [8, 32], 2, 2
    started, load_before = time.perf_counter(), load()
    torch.set_num_threads(args.threads)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    logging.getLogger("fl_lightning").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    dm = datamodule(max(args.cohorts))
    rows, diffs = [], []
    for i, per_round in enumerate(args.cohorts):
        order = list(WAYS)[i % 3 :] + list(WAYS)[: i % 3]
        rates, finals = {}, {}
        for way in order:
            times, finals[way] = run(way, dm, per_round, args.steps, args.rounds)
            rates[way] = per_round / np.median(times[1:], axis=0)  # (wall, CPU) clients per second
            print(f"{per_round} clients/round {way}: {rates[way][0]:.1f} clients/s", file=sys.stderr)
        diffs.append(max_abs_diff(finals["lean"], finals["batched"]))
        rows += [
            f"| {per_round} | {WAYS[way]} | {rates[way][0]:.1f} | {rates[way][1]:.1f} | {rates[way][0] / rates['lean'][0]:.2f}x "
            f"| {rates[way][1] / rates['lean'][1]:.2f}x |"
            for way in WAYS
        ]
    group, stacked, whole = stacked_bytes(dm, 32)
    lines = [
        "## Many LoRA adapters over one frozen base: batched vs lean (issue 41)",
        "",
        *header(started, load_before, threads=args.threads),
        f"- workload: configs/llm/lora_tiny_gpt2.yaml's model (dropout 0), {args.steps} local AdamW steps of 8 x 32 "
        f"tokens, {args.rounds} rounds per fit (first dropped), ways in rotating order per cohort",
        "",
        "| clients / round | way | clients/s (wall) | clients/s (CPU) | vs lean (wall) | vs lean (CPU) |",
        "|---|---|---|---|---|---|",
        *rows,
        "",
        f"- final adapters, max abs difference (b) vs (a), per cohort: {', '.join(f'{d:.2g}' for d in diffs)}",
        f"- stacked for the largest group of a 32-client round ({group} clients): {stacked:,} B (the adapters, {group} "
        f"copies); stacking every tensor of the module would be {whole:,} B ({whole / stacked:.1f}x)",
    ]
    emit("\n".join(lines) + "\n", args.out)


if __name__ == "__main__":
    main()
