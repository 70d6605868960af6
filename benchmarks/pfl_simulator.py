"""pfl-research's own simulator on its CIFAR-10 IID set-up: seconds per round, as JSON on stdout.

Runs in pfl-research's environment (``pfl[pytorch]==0.6.0``; it imports neither fl_lightning nor the other
benchmark modules). ``pfl_side_by_side.py`` starts it with ``--pfl-python``. What it runs is pfl's
``benchmarks/image_classification/pytorch/train.py`` with ``configs/baseline.yaml`` (apple/pfl-research):
``make_iid_federated_dataset`` (1000 users x 50 images in a fixed order, pfl's ``random`` user sampler: each
cohort member drawn uniformly with replacement), ``simple_cnn`` (channels-last input transposed by its first
layer, Xavier-uniform weights, dropout 0.25 / 0.5, the benchmark's cross-entropy ``loss``), local SGD lr 0.1,
batch 10, 1 epoch, ``FederatedAveraging`` with ``WeightByUser`` and a central SGD at lr 1, on the CPU. The images
are synthetic N(0, 1) tensors of CIFAR-10's shape (no network; throughput does not depend on pixel values).

One thing differs from the benchmark, so that the work timed is training alone (as in ``pfl_cifar10.py``):
``evaluation_frequency`` is the run's length, so the only round that evaluates is the first (a warm-up round,
not timed), and no ``CentralEvaluationCallback`` is attached. With ``--evaluate`` the benchmark's schedule is
kept instead (every 10th round: each trained user evaluated before and after training, and the central
evaluation of 10,000 images at batch 10,000), to price what that schedule adds.
"""

from __future__ import annotations

import argparse
import json
import time
import types
from importlib.metadata import version

import numpy as np
import torch
import torch.nn.functional as F
from pfl.aggregate.simulate import SimulatedBackend
from pfl.aggregate.weighting import WeightByUser
from pfl.algorithm import FederatedAveraging, NNAlgorithmParams
from pfl.callback.base import TrainingProcessCallback
from pfl.callback.central_evaluation import CentralEvaluationCallback
from pfl.data import FederatedDataset
from pfl.data.dataset import Dataset
from pfl.data.sampling import get_user_sampler
from pfl.hyperparam import NNEvalHyperParams, NNTrainHyperParams
from pfl.metrics import Metrics, Weighted
from pfl.model.pytorch import PyTorchModel
from torch import Tensor, nn

SAMPLES_PER_USER, SIDE, CLASSES = 50, 32, 10
EVALUATION_EVERY, CENTRAL_IMAGES = 10, 10_000  # baseline.yaml: evaluation_frequency, CIFAR-10's test set


class Transpose2D(nn.Module):
    """pfl's ``benchmarks/model/pytorch/layer.py``: channels-last images to PyTorch's layout."""

    def forward(self, inputs: Tensor) -> Tensor:
        return inputs.permute((0, 3, 1, 2))


def loss(self: nn.Module, inputs: Tensor, targets: Tensor, eval: bool = False) -> Tensor:
    """pfl's ``image_classification_loss``."""
    self.eval() if eval else self.train()
    return F.cross_entropy(self(inputs), targets.long())


@torch.no_grad()
def metrics(self: nn.Module, inputs: Tensor, targets: Tensor, eval: bool = True) -> dict[str, Weighted]:
    """pfl's ``image_classification_metrics``."""
    self.eval() if eval else self.train()
    logits = self(inputs)
    correct = (logits.argmax(-1) == targets.long()).float().sum().item()
    total = F.cross_entropy(logits, targets.long(), reduction="sum").item()
    return {"loss": Weighted(total, len(inputs)), "accuracy": Weighted(correct, len(inputs))}


def simple_cnn() -> nn.Module:
    """pfl's ``simple_cnn((32, 32, 3), 10)`` (``benchmarks/model/pytorch/cnn.py``)."""
    pooled = (SIDE - 4) // 2
    model = nn.Sequential(
        Transpose2D(), nn.Conv2d(3, 32, 3), nn.ReLU(), nn.Conv2d(32, 64, 3), nn.ReLU(), nn.MaxPool2d(2),
        nn.Dropout(0.25), nn.Flatten(), nn.Linear(pooled * pooled * 64, 128), nn.ReLU(), nn.Dropout(0.5),
        nn.Linear(128, CLASSES),
    )  # fmt: skip
    for m in model.modules():
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            nn.init.xavier_uniform_(m.weight)
    model.loss = types.MethodType(loss, model)
    model.metrics = types.MethodType(metrics, model)
    return model


class RoundClock(TrainingProcessCallback):
    """(wall s, process CPU s) at the start of training and after every central iteration."""

    def __init__(self) -> None:
        self.marks: list[tuple[float, float]] = []

    def on_train_begin(self, *, model: PyTorchModel) -> Metrics:
        self.marks.append((time.perf_counter(), time.process_time()))
        return Metrics()

    def after_central_iteration(self, aggregate_metrics: Metrics, model: PyTorchModel, *, central_iteration: int):
        self.marks.append((time.perf_counter(), time.process_time()))
        return False, Metrics()


def run(users: int, cohort: int, rounds: int, evaluate: bool, seed: int) -> list[tuple[float, float]]:
    """Seconds (wall, CPU) of each of ``rounds`` rounds of pfl's simulator."""
    torch.manual_seed(seed)
    np.random.seed(seed)
    g = torch.Generator().manual_seed(seed)
    images = torch.randn(users * SAMPLES_PER_USER, SIDE, SIDE, 3, generator=g)
    labels = torch.randint(0, CLASSES, (users * SAMPLES_PER_USER,), generator=g)
    user_data = {
        u: (images[u * SAMPLES_PER_USER : (u + 1) * SAMPLES_PER_USER], labels[u * SAMPLES_PER_USER : (u + 1) * SAMPLES_PER_USER])
        for u in range(users)
    }
    train = FederatedDataset.from_slices(user_data, get_user_sampler("random", range(users)))
    net = simple_cnn()
    model = PyTorchModel(
        model=net, local_optimizer_create=torch.optim.SGD, central_optimizer=torch.optim.SGD(net.parameters(), 1.0)
    )
    callbacks: list[TrainingProcessCallback] = []
    eval_params = NNEvalHyperParams(local_batch_size=CENTRAL_IMAGES)
    if evaluate:
        central = Dataset(raw_data=[torch.randn(CENTRAL_IMAGES, SIDE, SIDE, 3, generator=g),
                                    torch.randint(0, CLASSES, (CENTRAL_IMAGES,), generator=g)])  # fmt: skip
        callbacks.append(CentralEvaluationCallback(central, model_eval_params=eval_params, frequency=EVALUATION_EVERY))
    clock = RoundClock()  # after the evaluation: a round's mark includes the evaluation that follows it
    callbacks.append(clock)
    FederatedAveraging().run(
        algorithm_params=NNAlgorithmParams(
            central_num_iterations=rounds,
            evaluation_frequency=EVALUATION_EVERY if evaluate else rounds,
            train_cohort_size=cohort,
            val_cohort_size=0,
        ),
        backend=SimulatedBackend(training_data=train, val_data=None, postprocessors=[WeightByUser()]),
        model=model,
        model_train_params=NNTrainHyperParams(local_learning_rate=0.1, local_num_epochs=1, local_batch_size=10),
        model_eval_params=eval_params,
        callbacks=callbacks,
    )
    marks = np.asarray(clock.marks)
    if len(marks) != rounds + 1:
        raise RuntimeError(f"pfl ran {len(marks) - 1} rounds, expected {rounds}")
    return np.diff(marks, axis=0).tolist()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--users", type=int, default=1000)
    parser.add_argument("--cohort", type=int, default=50)
    parser.add_argument("--rounds", type=int, required=True, help="rounds in all, warm-up included")
    parser.add_argument("--evaluate", action="store_true", help="keep pfl's evaluation schedule (every 10th round)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    for name in ("users", "cohort", "rounds", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    torch.set_num_threads(args.threads)
    rounds = run(args.users, args.cohort, args.rounds, args.evaluate, args.seed)
    print(json.dumps({"rounds": rounds, "pfl": version("pfl"), "torch": torch.__version__, "threads": torch.get_num_threads()}))


if __name__ == "__main__":
    main()
