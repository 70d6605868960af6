"""A federated fit with N processes, run as a script by the tests of this folder.

With ``--devices N`` Lightning's DDP launcher re-runs this script once per extra rank; with
``--num-nodes M`` it is launched once per node (``torchrun``). Every rank saves its final global
state and the logged round metrics to ``<out>/rank<r>.pt``.
"""

from __future__ import annotations

import argparse
import os
import signal
from datetime import timedelta
from pathlib import Path

import lightning.pytorch as pl
import torch

from fl_lightning import (
    AdaptiveClipping,
    CompressedFedAvg,
    DPFedAvg,
    FedALIGN,
    FedAvg,
    FedDyn,
    FederatedCallback,
    FederatedTrainer,
    FedMRN,
    FedProx,
    SCAFFOLD,
    MedianNormFilter,
    QFedAvg,
    ServerSGD,
)
from fl_lightning.algorithms import ClientContext, ClientUpdate
from fl_lightning.compression import TopKCodec, as_wire, from_wire
from fl_lightning.data import Digits, Dirichlet, FederatedDataModule
from fl_lightning.distributed import FederatedDDPStrategy
from fl_lightning.models import MLP
from fl_lightning.models.masked_networks import MaskedMLP
from fl_lightning.robust import Byzantine, CoordinateMedian, Krum, SignFlip
from fl_lightning.secure import SecureAggregation
from tests.algorithms.stateful import RunningMeanFedAvg
from tests.distributed.runs import RUNS


ALGORITHMS = {
    "fedavg": lambda: FedAvg(),
    "fedavgm": lambda: FedAvg(server_optimizer=ServerSGD(lr=1.0, momentum=0.9)),
    "fedprox": lambda: FedProx(mu=0.1),
    # Per-client state follows its client across ranks: every rank stores every aggregated client's state.
    "scaffold": lambda: SCAFFOLD(),
    "feddyn": lambda: FedDyn(alpha=0.1),
    "fedalign": lambda: FedALIGN(priority=3, epsilon=0.3, warmup_fraction=0.0, algorithm=FedProx(mu=0.1)),
    # Clips some clients, adapts the clip norm from the all-reduced count, adds the server's noise once.
    "dpfedavg": lambda: DPFedAvg(
        noise_multiplier=0.5, clip_norm=0.5, adaptive_clipping=AdaptiveClipping(count_noise_std=1.0), algorithm=FedProx(mu=0.1)
    ),
    # Secure mode: rank 0's secret, broadcast at set-up, gives every rank the same Poisson sample and noise.
    "dpfedavg-secure": lambda: DPFedAvg(
        noise_multiplier=0.5, clip_norm=0.5, sampling="poisson", secure_mode=True, algorithm=FedProx(mu=0.1)
    ),
    # Robust rules need every update: the ranks gather the round's decoded updates and each applies the rule.
    "median": lambda: CoordinateMedian(algorithm=FedProx(mu=0.1)),
    "krum": lambda: Byzantine(
        attack=SignFlip(scale=3.0),
        fraction=0.25,
        algorithm=Krum(num_byzantine=1, num_selected=2, algorithm=FedAvg(server_optimizer=ServerSGD(lr=1.0, momentum=0.9))),
    ),
    # Attackers over a summable algorithm: client-side, so clients shard; the round counts them all the same.
    "byzantine": lambda: Byzantine(attack=SignFlip(scale=3.0), fraction=0.25, algorithm=FedProx(mu=0.1)),
    # Each rank masks and sums its clients; the pads cancel in one int64 all-reduce, dropouts recovered.
    "secagg": lambda: SecureAggregation(algorithm=FedProx(mu=0.1), dropout=0.3, min_survivors=0.4),
    # Compressed uploads: each rank decodes and sums its clients' payloads (FedMRN on its masked model).
    "fedmrn": lambda: FedMRN(server_optimizer=ServerSGD(lr=1.0, momentum=0.9)),
    "topk": lambda: CompressedFedAvg(codec=TopKCodec(density=0.1)),
    # Over FedMRN's decoded updates: DP clips and sums per rank; the median gathers them to every rank.
    "dpfedmrn": lambda: DPFedAvg(
        noise_multiplier=0.5, clip_norm=0.05, log_client_statistics=True, algorithm=FedMRN(weighting="uniform")
    ),
    "median-fedmrn": lambda: CoordinateMedian(algorithm=FedMRN()),
    # Each client's h_k rides as its weight: the h-weighted sum shards like FedAvg's.
    "qffedavg": lambda: QFedAvg(q=1.0),
    # Per-client state in a ClientStore: each client trains on its owner rank, whose store alone holds it.
    "stateful": RunningMeanFedAvg,
}

#: FedMRN masks seeded noise, which needs MaskedNoiseMixin; the other algorithms train the plain MLP.
MODELS = {"fedmrn": MaskedMLP, "dpfedmrn": MaskedMLP, "median-fedmrn": MaskedMLP}


class CorruptUploads(FederatedCallback):
    """Cuts the last byte off the compressed uploads of clients 2 and 3: malformed payloads, rejected on
    the rank that trained the client (in the last of 3 rounds, one on each of 2 ranks)."""

    def on_client_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, client: ClientContext, update: ClientUpdate) -> None:
        if client.client_id in (2, 3):
            update.payload = as_wire(from_wire(update.payload)[:-1])


class FreezeRank1(FederatedCallback):
    """Stops rank 1 (SIGSTOP) as round 1 starts, as a frozen node would: a hung peer."""

    def on_clients_selected(self, trainer: pl.Trainer, pl_module: pl.LightningModule, round_idx: int, client_ids: list[int]) -> None:
        if round_idx == 1 and trainer.global_rank == 1:
            os.kill(os.getpid(), signal.SIGSTOP)


FAULTS = {"none": list, "corrupt": lambda: [CorruptUploads()], "freeze": lambda: [FreezeRank1()]}


class StepCosineMLP(MLP):
    """The standard per-step recipe: a cosine over ``trainer.estimated_stepping_batches``, ``interval="step"``."""

    def configure_optimizers(self) -> dict:
        optimizer = super().configure_optimizers()
        scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=self.trainer.estimated_stepping_batches)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

UPDATE_BOUNDS = {
    "none": lambda: None,
    "median": lambda: MedianNormFilter(factor=1.2),  # rejects some clients every round
}


def fit(
    out: Path,
    *,
    devices: int = 1,
    num_nodes: int = 1,
    algorithm: str = "fedavg",
    executor: str = "lightning",
    rounds: int = 3,
    clients_per_round: int = 5,
    resume: Path | None = None,
    update_bound: str = "none",
    fault: str = "none",
    step_schedule: bool = False,
    timeout: float = 600.0,
    client_state_memory: int | None = None,
) -> None:
    """Runs the federated fit; every rank saves its final global state, round metrics and history."""
    pl.seed_everything(0, verbose=False)
    model = (StepCosineMLP if step_schedule else MODELS.get(algorithm, MLP))(in_features=64, hidden=(32,), lr=0.1)
    data = FederatedDataModule(
        Digits(split="train"), Digits(split="test"), partitioner=Dirichlet(alpha=0.5), num_clients=12, batch_size=16
    )
    out.mkdir(parents=True, exist_ok=True)
    trainer = FederatedTrainer(
        algorithm=ALGORITHMS[algorithm](),
        clients_per_round=clients_per_round,
        local_epochs=1,
        seed=3,
        client_executor=executor,
        update_bound=UPDATE_BOUNDS[update_bound](),
        client_state_memory=client_state_memory,
        max_epochs=rounds,
        accelerator="cpu",
        devices=devices,
        num_nodes=num_nodes,
        strategy=FederatedDDPStrategy(timeout=timedelta(seconds=timeout)) if devices * num_nodes > 1 else "auto",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        default_root_dir=out,
        callbacks=FAULTS[fault](),  # and the trainer's own checkpoint: <out>/checkpoints/round_<r>.ckpt, last.ckpt
    )
    trainer.fit(model, datamodule=data, ckpt_path=resume)
    torch.save(
        {
            "global_state": trainer.fit_loop.global_state,
            "metrics": {k: float(v) for k, v in trainer.callback_metrics.items()},
            "history": trainer.fit_loop.history,
        },
        out / f"rank{trainer.global_rank}.pt",
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--num-nodes", type=int, default=1)
    parser.add_argument("--algorithm", choices=sorted(ALGORITHMS), default="fedavg")
    parser.add_argument("--executor", choices=["lightning", "lean", "batched"], default="lightning")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients-per-round", type=int, default=5)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--resume", type=Path, default=None, help="checkpoint to resume from")
    parser.add_argument("--update-bound", choices=sorted(UPDATE_BOUNDS), default="none")
    parser.add_argument("--fault", choices=sorted(FAULTS), default="none")
    parser.add_argument("--step-schedule", action="store_true", help="a per-step cosine LR schedule")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds a process waits for the others")
    parser.add_argument("--client-state-memory", type=int, default=None, help="bytes of per-client state in memory")
    parser.add_argument(
        "--runs", nargs="+", default=None, metavar="NAME",
        help="several fits of tests/distributed/runs.py in one launch, one after the other, each into <out>/<NAME> "
        "(one process start and one process group for all: a launch costs far more than a fit)",
    )  # fmt: skip
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.runs:
        for name in args.runs:
            arguments = dict(RUNS[name])
            if "resume" in arguments:
                arguments["resume"] = args.out / arguments["resume"] / "checkpoints" / "last.ckpt"
            fit(args.out / name, devices=args.devices, timeout=args.timeout, **arguments)
        return
    fit(
        args.out,
        devices=args.devices,
        num_nodes=args.num_nodes,
        algorithm=args.algorithm,
        executor=args.executor,
        rounds=args.rounds,
        clients_per_round=args.clients_per_round,
        resume=args.resume,
        update_bound=args.update_bound,
        fault=args.fault,
        step_schedule=args.step_schedule,
        timeout=args.timeout,
        client_state_memory=args.client_state_memory,
    )


if __name__ == "__main__":
    main()
