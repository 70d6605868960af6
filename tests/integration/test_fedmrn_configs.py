"""FedMRN's paper configs (FedMRN on four datasets, one per baseline): the model and algorithm
instantiate and fit together, the paper's federation settings hold, and the upload bytes quoted
in each file's header are the codec's exact payload size. No data is loaded (no download)."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import pytest
import yaml

from fl_lightning import CompressedFedAvg, FedAvg, FedMRN, FedPM, Federation, MaskedNoiseMixin, ProbabilityMaskMixin
from fl_lightning.server.model_state import tensor_bytes

CONFIGS = Path(__file__).resolve().parents[2] / "configs" / "papers"
PAPER = sorted(p for p in CONFIGS.glob("fedmrn_*.yaml") if p.name != "fedmrn_digits.yaml")


def instantiate(spec: Any) -> Any:
    """Builds ``{class_path, init_args}`` specs recursively (as the CLI would, without type checks)."""
    if isinstance(spec, dict) and "class_path" in spec:
        module, _, name = spec["class_path"].rpartition(".")
        args = {k: instantiate(v) for k, v in (spec.get("init_args") or {}).items()}
        return getattr(importlib.import_module(module), name)(**args)
    return spec


class NoData:
    """Just enough of a federated data source for ``Algorithm.setup``: 100 clients, no batches."""

    num_clients = 100

    def client_num_samples(self, cid: int) -> int:
        return 1

    def client_batches(self, cid: int, **kwargs: Any) -> list[Any]:
        return []


def test_every_dataset_and_baseline_has_a_config():
    names = {p.stem for p in PAPER}
    datasets = {f"fedmrn_{d}" for d in ("fmnist", "svhn", "cifar10", "cifar100")}
    baselines = {f"fedmrn_fmnist_{b}" for b in ("fedavg", "signsgd", "topk", "terngrad", "fedpm", "drive", "eden")}
    assert datasets | baselines <= names


@pytest.mark.parametrize("path", PAPER, ids=[p.stem for p in PAPER])
def test_config_instantiates_with_the_papers_settings_and_quoted_bytes(path):
    config = yaml.safe_load(path.read_text())
    trainer, data = config["trainer"], config["data"]["init_args"]
    # The paper's §5.1.4: 100 clients, 10 per round, 10 local epochs, batch 64.
    assert (data["num_clients"], trainer["clients_per_round"], trainer["local_epochs"], data["batch_size"]) == (100, 10, 10, 64)
    assert trainer["max_epochs"] == (200 if "cifar" in path.stem else 100)

    model, algorithm = instantiate(config["model"]), instantiate(trainer["algorithm"])
    mixin = ProbabilityMaskMixin if isinstance(algorithm, FedPM) else MaskedNoiseMixin
    assert isinstance(model, mixin)
    model.setup("fit")
    names = frozenset(n for n, _ in model.named_parameters())
    algorithm.setup(Federation(data=NoData(), module=model, clients_per_round=10, seed=0, param_names=names))
    if isinstance(algorithm, CompressedFedAvg):  # FedMRN, FedPM and the codec baselines
        upload = algorithm.codec.payload_size(algorithm.layout)
    else:
        assert type(algorithm) is FedAvg
        upload = tensor_bytes(model.state_dict())
    assert f"{upload:,} bytes" in path.read_text(), f"the header should quote the {upload:,}-byte upload"
    if isinstance(algorithm, FedMRN):
        assert model.hparams.lr == 0.1  # the authors' FedMRN lr
    assert model.hparams.momentum == 0.0  # plain SGD (or Adam for FedPM's scores)
