"""FedMRN vs FedAvg and the 1-bit / sparse baselines on offline data (issue 7).

Compares, through the real :class:`~fl_lightning.FederatedTrainer`, the final test accuracy and
the total uploaded bytes of FedAvg, FedMRN (binary masks), FedMRNS (signed masks), SignSGD
(stochastic sign with a scale), Top-k (values + indices counted), TernGrad, FedPM (Bernoulli masks
over frozen random weights, same MLP as a ``ProbabilityMaskedMLP``), DRIVE and EDEN (1 bit per
rotated coordinate; each tensor is padded to a power of two: 1.54 bits per weight here, seeds and
scales included).
Data: scikit-learn's bundled digits (no download), Dirichlet(0.3) label skew over 20 clients,
10 per round. Model: a bias-free MLP 64-200-200-10 (every parameter is a Linear weight, so
FedMRN's upload is pure mask bits + seed, like the paper's bias-free CNNs; its BatchNorm tensors
would be sent in fp32). ``--model bn-cnn`` is the paper's CNN4 cut to the 8x8 digits (its first three
conv-BN-ReLU-pool blocks, bias-free, N(0, 0.01²) init; BatchNorm tensors go up in fp32), ``--model
cnn-no-bn`` the same without BatchNorm; ``--partition labels`` is the paper's Non-IID-2 (3 labels per
client). ``FedMRN-noSM`` / ``-noPM`` / ``-noPSM`` and ``FedAvgSM`` are the paper's Fig. 4 ablations.

Hyper-parameters (tuned on seed 0, 40 rounds; see benchmarks/RESULTS.md): local lr 0.3 for
every method except SignSGD (0.1; it diverges at 0.3), each the best of 0.1 / 0.3 (FedAvg and
FedMRN also tried 0.5); FedPM trains its scores with Adam (the FedPM authors' optimizer) at lr
0.3, the best of Adam {0.03, 0.1, 0.3, 1.0} and plain SGD {10, 30, 100} (SGD barely moves the
scores). DRIVE and EDEN: 0.3 (final accuracy 96.4 % vs 93.6 % at 0.1); EDEN at 1 bit decodes
as DRIVE up to float32 rounding, so their rows differ only where that rounding grows over the
run. FedMRN noise alpha = 0.16 and FedMRNS 0.08, not the paper's 1e-2 / 5e-3: alpha must cover
the per-round update of a coordinate (paper Fig. 5, notes §5.5), and this MLP's PyTorch default
init and its per-round deltas are about ten times the scale of the paper's CNNs initialised from
N(0, 0.01²).

Within a seed every method sees the same partition, initial weights (FedPM re-draws its frozen
weights from the seed), client selection and client batch order. Reported per method: mean ±
sample std over seeds of the final-round test accuracy and of the mean accuracy over the last
``--tail`` rounds, its difference to FedAvg, the exact uploaded bytes (from
``ClientUpdate.upload_bytes``) with the ratio to FedAvg's, and the bytes each client downloads
per round (``Algorithm.download_bytes``).

Run from the repository root::

    PYTHONPATH=. python benchmarks/fedmrn.py                 # default, 4-9 min on 2 CPU cores (load-dependent)
    PYTHONPATH=. python benchmarks/fedmrn.py --quick         # ~1 min smoke run
    PYTHONPATH=. python benchmarks/fedmrn.py --rounds 100 --methods FedAvg FedMRN FedMRNS   # ~20 min
    PYTHONPATH=. python benchmarks/fedmrn.py --lr SignSGD=0.05 --alpha 0.08 --out table.md
    PYTHONPATH=. python benchmarks/fedmrn.py --methods FedAvg FedMRN FedMRNS --init paper --alpha 0.01 \
        --lr FedAvg=0.03 FedMRN=0.1 FedMRNS=0.1     # the paper's α, init and learning rates (~5 min)
    PYTHONPATH=. python benchmarks/fedmrn.py --model bn-cnn --methods FedAvg FedMRN FedMRNS --alpha 0.01 \
        --lr FedAvg=0.03 FedMRN=0.1 FedMRNS=0.1 --seeds 0 1 2 3 4   # the paper's α and init with BatchNorm (7 CPU-min)
    PYTHONPATH=. python benchmarks/fedmrn.py --model bn-cnn --partition labels --alpha 0.01 \
        --methods FedAvg FedMRN FedMRN-noSM FedMRN-noPM FedMRN-noPSM FedAvgSM SignSGD \
        --lr FedAvg=0.03 SignSGD=0.03 FedMRN=0.1 FedMRN-noSM=0.1 FedMRN-noPM=0.1 FedMRN-noPSM=0.1 FedAvgSM=0.1 \
        --contrast FedMRN-noPM:FedMRN-noSM FedMRN-noPM:FedAvgSM FedMRN-noPSM:SignSGD   # Fig. 4 (17 CPU-min)
    PYTHONPATH=. python benchmarks/fedmrn.py --speed --accelerator gpu   # rounds/s, CNN4 on FMNIST-shaped tensors

Runs are spread over ``--jobs`` worker processes (default: the CPU count), each with one torch
thread: torch's default intra-op threads make these tiny models several times slower.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context
from typing import Any

import lightning.pytorch as pl
import torch
from harness import QUIET_TRAINER
from lightning.pytorch.callbacks import Callback
from reporting import emit, header, load, mean_std, significance  # benchmarks/ is on sys.path when run as a script
from workers import init_worker, quiet


def _methods() -> dict[str, Callable[[argparse.Namespace], object]]:
    """Method name -> algorithm factory."""
    from fl_lightning import CompressedFedAvg, FedAvg, FedMRN, FedMRNS, FedPM
    from fl_lightning.algorithms.fedavg_sm import FedAvgSM
    from fl_lightning.compression import DriveCodec, EdenCodec, StochasticSignCodec, TernGradCodec, TopKCodec

    return {
        "FedAvg": lambda a: FedAvg(),
        "FedMRN": lambda a: FedMRN(alpha=a.alpha),
        "FedMRNS": lambda a: FedMRNS(alpha=a.alpha / 2),
        # The paper's Fig. 4 ablations (§5.3-5.4): SM = stochastic masking, PM = progressive masking.
        "FedMRN-noSM": lambda a: FedMRN(alpha=a.alpha, stochastic=False),
        "FedMRN-noPM": lambda a: FedMRN(alpha=a.alpha, progressive=False),
        "FedMRN-noPSM": lambda a: FedMRN(alpha=a.alpha, stochastic=False, progressive=False),
        "FedAvgSM": lambda a: FedAvgSM(alpha=a.alpha),
        "SignSGD": lambda a: CompressedFedAvg(codec=StochasticSignCodec()),
        "Top-k": lambda a: CompressedFedAvg(codec=TopKCodec(density=a.density)),
        "TernGrad": lambda a: CompressedFedAvg(codec=TernGradCodec()),
        "FedPM": lambda a: FedPM(),
        "DRIVE": lambda a: CompressedFedAvg(codec=DriveCodec()),
        "EDEN": lambda a: CompressedFedAvg(codec=EdenCodec(bits=1)),
    }


#: Local learning rates tuned on seed 0 over {0.1, 0.3} (FedAvg, FedMRN: also 0.5; FedPM: see the docstring);
#: the Fig. 4 ablations take FedMRN's, untuned.
DEFAULT_LR = {
    "FedAvg": 0.3,
    "FedMRN": 0.3,
    "FedMRNS": 0.3,
    "FedMRN-noSM": 0.3,
    "FedMRN-noPM": 0.3,
    "FedMRN-noPSM": 0.3,
    "FedAvgSM": 0.3,
    "SignSGD": 0.1,
    "Top-k": 0.3,
    "TernGrad": 0.3,
    "FedPM": 0.3,
    "DRIVE": 0.3,
    "EDEN": 0.3,
}
#: The methods of the default run (issue 7); the Fig. 4 ablations run when named in ``--methods``.
DEFAULT_METHODS = ["FedAvg", "FedMRN", "FedMRNS", "SignSGD", "Top-k", "TernGrad", "FedPM", "DRIVE", "EDEN"]
#: Weight initialisations of the MLP (FedPM's frozen random weights keep their own).
INITS = {"default": "PyTorch default init", "paper": "Linear weights N(0, 0.01²) as the paper's CNNs"}
#: Models: the bias-free MLP, or the paper's CNN4 blocks (conv, BN, ReLU, pool; N(0, 0.01²) init) cut to 8x8 digits.
MODELS = {
    "mlp": "bias-free MLP 64-200-200-10",
    "bn-cnn": "bias-free CNN4 blocks of 32, 64, 128 channels (conv-BN-ReLU-pool, 8 -> 1 pixel) + linear, N(0, 0.01²) init",
    "cnn-no-bn": "bn-cnn with every BatchNorm replaced by the identity (the control that isolates BatchNorm)",
}
#: CNN4's output channels for the digits stand-in: its first three pooled blocks (8x8 -> 1x1).
BN_CNN_CHANNELS = (32, 64, 128)
#: Partitions: issue 7's Dirichlet label skew, or the paper's Non-IID-2 (3 labels per client, balanced assignment).
PARTITIONS = {"dirichlet": "Dirichlet(0.3) label skew", "labels": "Non-IID-2: 3 labels per client (balanced)"}
#: Local optimizers other than plain SGD.
DEFAULT_OPTIMIZER = {"FedPM": "adam"}


def learning_rate(method: str, args: argparse.Namespace) -> float:
    return float(args.lr.get(method, DEFAULT_LR[method]))


def optimizer(method: str, args: argparse.Namespace) -> str:
    return str(args.optimizer.get(method, DEFAULT_OPTIMIZER.get(method, "sgd")))


@dataclass
class RunResult:
    method: str
    seed: int
    accuracy: list[float]
    upload_bytes: int
    download_bytes: int
    payload_bytes: int
    client_download_bytes: int
    wall_s: float
    params: int


class MetricPerRound(Callback):
    """Collects ``trainer.callback_metrics[key]`` at the end of every round."""

    def __init__(self, key: str) -> None:
        self.key = key
        self.values: list[float] = []

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.values.append(float(trainer.callback_metrics[self.key]))


def run_one(method: str, seed: int, args: argparse.Namespace) -> RunResult:
    """One federated fit; returns the per-round test accuracy and the byte counts."""
    init_worker(threads=1)
    from fl_lightning import FederatedTrainer
    from fl_lightning.callbacks import TestCurve
    from fl_lightning.data import Digits, Dirichlet, FederatedDataModule, LabelsPerClient
    from fl_lightning.models.masked_networks import CNN4, MaskedMLP, ProbabilityMaskedCNN4, ProbabilityMaskedMLP

    factory = _methods()[method]
    image = args.model != "mlp"
    partitioner = LabelsPerClient(3, "balanced") if args.partition == "labels" else Dirichlet(alpha=0.3, min_samples=10)
    data = FederatedDataModule(
        Digits(split="train", as_image=image),
        Digits(split="test", as_image=image),
        partitioner=partitioner,
        num_clients=args.clients,
        batch_size=args.batch_size,
        seed=seed,
    )
    torch.manual_seed(seed)
    training = {"lr": learning_rate(method, args), "optimizer": optimizer(method, args)}
    model: pl.LightningModule
    if image:  # CNN4's blocks draw their conv/linear weights from N(0, 0.01²) themselves
        cnn_class = ProbabilityMaskedCNN4 if method == "FedPM" else CNN4
        model = cnn_class(image_size=8, channels=BN_CNN_CHANNELS, **training)
        if args.model == "cnn-no-bn":
            for i, layer in enumerate(model.net):
                if isinstance(layer, torch.nn.BatchNorm2d):
                    model.net[i] = torch.nn.Identity()
    else:
        model_class = ProbabilityMaskedMLP if method == "FedPM" else MaskedMLP
        model = model_class(in_features=64, hidden=(200, 200), bias=False, **training)
        if args.init == "paper" and model_class is MaskedMLP:
            # The authors' init for every Conv/Linear weight (notes §3): N(0, 0.01²), the scale their α = 1e-2 matches.
            for m in model.modules():
                if isinstance(m, torch.nn.Linear):
                    torch.nn.init.normal_(m.weight, 0.0, 0.01)
    params = sum(p.numel() for p in model.parameters())  # before FedMRN adds its latent updates
    # The paper's per-round test-accuracy curve: an opt-in test run after every round (TestCurve).
    accuracy = MetricPerRound("test_acc")
    trainer = FederatedTrainer(
        algorithm=factory(args),  # type: ignore[arg-type]
        max_epochs=args.rounds,
        clients_per_round=args.per_round,
        local_epochs=args.local_epochs,
        seed=seed,
        accelerator="cpu",
        callbacks=[TestCurve(), accuracy],
        **QUIET_TRAINER,
    )
    started = time.perf_counter()
    trainer.fit(model, datamodule=data)
    loop = trainer.fit_loop
    clients = sum(len(c) for c in loop.history)
    return RunResult(
        method,
        seed,
        accuracy.values,
        loop.total_upload_bytes,
        loop.total_download_bytes,
        loop.total_upload_bytes // clients,
        loop.total_download_bytes // clients,
        time.perf_counter() - started,
        params,
    )


def speed(args: argparse.Namespace) -> str:
    """Seconds per round of FedAvg vs FedMRN and FedPM for the paper's CNN4 on synthetic FMNIST-shaped data."""
    quiet()
    from fl_lightning import FedAvg, FederatedTrainer, FedMRN, FedPM
    from fl_lightning.data import IID, FederatedDataModule, InMemoryDataset
    from fl_lightning.models.masked_networks import CNN4, ProbabilityMaskedCNN4

    g = torch.Generator().manual_seed(0)
    n = 10 * 64 * args.speed_steps
    dataset = InMemoryDataset(
        inputs=torch.randn(n, 1, 28, 28, generator=g), labels=torch.randint(0, 10, (n,), generator=g), num_classes=10
    )
    rows = ["| algorithm | s / round (median) | rounds / s | vs FedAvg |", "|---|---:|---:|---:|"]
    base = None
    for name, algorithm, model_class in (
        ("FedAvg", FedAvg(), CNN4),
        ("FedMRN", FedMRN(), CNN4),
        ("FedPM", FedPM(), ProbabilityMaskedCNN4),
    ):
        times = MetricPerRound("round/wall_time_s")
        trainer = FederatedTrainer(
            algorithm=algorithm,
            max_epochs=args.speed_rounds + 1,
            clients_per_round=10,
            local_steps=args.speed_steps,
            accelerator=args.accelerator,
            callbacks=[times],
            **QUIET_TRAINER,
        )
        data = FederatedDataModule(dataset, partitioner=IID(), num_clients=10, batch_size=64)
        torch.manual_seed(0)
        trainer.fit(model_class(lr=0.1), datamodule=data)
        median = statistics.median(times.values[1:])  # round 0 warms up
        base = base or median
        rows.append(f"| {name} | {median:.3f} | {1 / median:.2f} | {median / base:.2f}× |")
    device = torch.cuda.get_device_name() if args.accelerator == "gpu" else f"CPU ({torch.get_num_threads()} threads)"
    head = (
        f"CNN4 (389,920 masked weights), 10 clients x {args.speed_steps} steps of batch 64 per round, "
        f"{args.speed_rounds} timed rounds after one warm-up; {device}."
    )
    return "\n".join([head, "", *rows])


def _mean_std(values: Sequence[float]) -> str:
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{100 * statistics.mean(values):.1f} ± {100 * std:.1f}"


def report(results: list[RunResult], args: argparse.Namespace, head: list[str]) -> str:
    by_method: dict[str, list[RunResult]] = {}
    for r in results:
        by_method.setdefault(r.method, []).append(r)
    base = {r.seed: r for r in by_method["FedAvg"]}
    base_upload = statistics.mean(r.upload_bytes for r in base.values())
    params = base[args.seeds[0]].params
    lines = [
        (
            "| method | bytes / client upload | bits / param | total upload (MB) | vs FedAvg | bytes / client download "
            f"| final acc (%) | last-{args.tail} acc (%) | Δ final vs FedAvg (pts) | 95 % CI, significant | final per seed "
            "| s / run |"
        ),
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---:|",
    ]
    for method, runs in by_method.items():
        final = [r.accuracy[-1] for r in runs]
        tail = [statistics.mean(r.accuracy[-args.tail :]) for r in runs]
        delta = [r.accuracy[-1] - base[r.seed].accuracy[-1] for r in runs]
        upload = statistics.mean(r.upload_bytes for r in runs)
        payload = runs[0].payload_bytes
        lines.append(
            f"| {method} | {payload:,} | {8 * payload / params:.2f} | {upload / 1e6:.2f} | {base_upload / upload:.1f}× "
            f"| {runs[0].client_download_bytes:,} | {_mean_std(final)} | {_mean_std(tail)} | {100 * statistics.mean(delta):+.1f} "
            f"(min {100 * min(delta):+.1f}) | {significance([100 * d for d in delta]) if method != 'FedAvg' else '–'} "
            f"| {', '.join(f'{100 * f:.1f}' for f in final)} | {statistics.mean(r.wall_s for r in runs):.0f} |"
        )
    contrasts = [_contrast(by_method, a, b) for a, b in args.contrast]
    init = f", {INITS[args.init]}" if args.model == "mlp" else ""
    settings = (
        f"digits (1,437 train / 360 test), {args.clients} clients {PARTITIONS[args.partition]}, {args.per_round} per round, "
        f"{args.rounds} rounds, {args.local_epochs} local epochs, batch {args.batch_size}; {MODELS[args.model]} "
        f"({params:,} parameters{init}); local lr {', '.join(f'{m} {learning_rate(m, args)}' for m in by_method)} "
        f"(SGD{''.join(f', {m} {optimizer(m, args)}' for m in by_method if optimizer(m, args) != 'sgd')}); FedMRN α {args.alpha}, "
        f"FedMRNS α {args.alpha / 2}; Top-k density {args.density}; seeds {args.seeds}."
    )
    return "\n".join(
        [
            *head,
            "",
            f"Setting: {settings}",
            "",
            *lines,
            *(["", CONTRAST_HEAD, "|---|---:|---|---|", *contrasts] if contrasts else []),
        ]
    )


CONTRAST_HEAD = "| A minus B (final acc, pts) | mean ± std | 95 % CI, significant | A better / tied / worse |"


def _contrast(by_method: dict[str, list[RunResult]], a: str, b: str) -> str:
    """One paired row: method ``a``'s final accuracy minus ``b``'s, seed by seed, under the one significance rule."""
    other = {r.seed: r.accuracy[-1] for r in by_method[b]}
    diffs = [100 * (r.accuracy[-1] - other[r.seed]) for r in by_method[a]]
    better, worse = sum(d > 0 for d in diffs), sum(d < 0 for d in diffs)
    return (
        f"| {a} minus {b} | {mean_std(diffs, digits=1)} | {significance(diffs)} "
        f"| {better} / {len(diffs) - better - worse} / {worse} |"
    )


def _method_pairs(
    parser: argparse.ArgumentParser, option: str, items: list[str], convert: Callable[[str], Any]
) -> dict[str, Any]:
    """``METHOD=VALUE`` items as a dict; exits with a usage error on a malformed item or unknown method."""
    try:
        pairs = {m: convert(v) for m, v in (item.split("=") for item in items)}
    except ValueError:
        parser.error(f"{option} takes METHOD=VALUE pairs, got {items}")
    unknown = set(pairs) - set(DEFAULT_LR)
    if unknown:
        parser.error(f"{option}: unknown methods {sorted(unknown)}; choose from {list(DEFAULT_LR)}")
    return pairs


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--methods", nargs="+", default=DEFAULT_METHODS, choices=list(_methods()))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--per-round", type=int, default=10)
    parser.add_argument("--local-epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", nargs="+", default=[], metavar="METHOD=LR", help=f"local learning rates overriding {DEFAULT_LR}")
    parser.add_argument(
        "--optimizer",
        nargs="+",
        default=[],
        metavar="METHOD=NAME",
        help=f"local optimizers (sgd, adam) overriding {DEFAULT_OPTIMIZER}",
    )
    parser.add_argument("--alpha", type=float, default=0.16, help="FedMRN noise magnitude (FedMRNS uses half)")
    parser.add_argument(
        "--init", choices=list(INITS), help="weight init of the MLP (default: default); the CNNs always have the paper's"
    )
    parser.add_argument("--model", default="mlp", choices=list(MODELS), help="; ".join(f"{k}: {v}" for k, v in MODELS.items()))
    parser.add_argument("--partition", default="dirichlet", choices=list(PARTITIONS))
    parser.add_argument("--density", type=float, default=0.03, help="Top-k kept fraction")
    parser.add_argument("--tail", type=int, default=5)
    parser.add_argument(
        "--contrast", nargs="+", default=[], metavar="A:B", help="paired rows: method A's final accuracy minus B's, per seed"
    )
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--quick", action="store_true", help="10 rounds, one seed")
    parser.add_argument("--out", help="also write the table to this file")
    parser.add_argument("--speed", action="store_true", help="time FedAvg vs FedMRN rounds on CNN4 instead")
    parser.add_argument("--accelerator", default="cpu", help="for --speed: cpu or gpu")
    parser.add_argument("--speed-rounds", type=int, default=3)
    parser.add_argument("--speed-steps", type=int, default=5)
    args = parser.parse_args(argv)
    args.lr = _method_pairs(parser, "--lr", args.lr, float)
    args.optimizer = _method_pairs(parser, "--optimizer", args.optimizer, str)
    if args.model != "mlp" and args.init == "default":
        parser.error(f"--init default applies to the MLP only; --model {args.model} has the paper's N(0, 0.01²) init")
    args.init = args.init or ("paper" if args.model != "mlp" else "default")
    if args.quick:
        args.rounds, args.seeds = 10, [0]
    if "FedAvg" not in args.methods:
        args.methods.insert(0, "FedAvg")
    pairs = [tuple(item.split(":")) for item in args.contrast]
    if any(len(p) != 2 or not set(p) <= set(args.methods) for p in pairs):
        parser.error(f"--contrast takes A:B pairs of the methods run {args.methods}, got {args.contrast}")
    args.contrast = pairs
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    if args.speed:
        print(speed(args))
        return
    started, load_before = time.perf_counter(), load()
    jobs = [(m, s) for s in args.seeds for m in args.methods]
    with ProcessPoolExecutor(max_workers=min(args.jobs, len(jobs)), mp_context=get_context("spawn")) as pool:
        futures = [pool.submit(run_one, m, s, args) for m, s in jobs]
        results = []
        for future in futures:
            results.append(future.result())
            r = results[-1]
            tail = statistics.mean(r.accuracy[-args.tail :])
            print(
                f"{r.method} seed {r.seed}: acc {r.accuracy[-1]:.3f} (last-{args.tail} {tail:.4f}), "
                f"upload {r.upload_bytes:,} B, {r.wall_s:.0f} s",
                flush=True,
            )
    table = report(results, args, header(started, load_before, workers=args.jobs, threads=1))
    emit(table, args.out)


if __name__ == "__main__":
    main()
