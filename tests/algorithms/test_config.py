"""Algorithms record their constructor arguments: nested and flat configuration."""

from __future__ import annotations

import copy
import pickle

import torch

from fl_lightning import FedAvg, FedProx, FedStaleWeight, ServerAdam, ServerSGD
from fl_lightning.algorithms.config import config_of, flat_config
from fl_lightning.compression import TopKCodec


def test_outermost_arguments_are_recorded_with_defaults_and_nested_objects():
    assert FedProx(mu=0.3).hparams() == {
        "mu": 0.3,
        "server_optimizer": {  # None became the default ServerSGD() the constructor made
            "class_path": "fl_lightning.algorithms.server_optimizers.ServerSGD",
            "init_args": {"lr": 1.0, "momentum": 0.0},
        },
        "weighting": "samples",
    }


def test_flat_config_names_classes_and_nested_arguments():
    flat = flat_config(FedAvg(server_optimizer=ServerAdam(lr=0.05), weighting="uniform"), "algorithm")
    assert flat == {
        "algorithm": "FedAvg",
        "algorithm.server_optimizer": "ServerAdam",
        "algorithm.server_optimizer.lr": 0.05,
        "algorithm.server_optimizer.beta1": 0.9,
        "algorithm.server_optimizer.beta2": 0.99,
        "algorithm.server_optimizer.tau": 0.001,
        "algorithm.weighting": "uniform",
    }


def test_kwargs_are_merged_and_plain_objects_report_their_attributes():
    flat = flat_config(FedStaleWeight(variant="alg1", buffer_size=3), "a")
    assert flat["a.buffer_size"] == 3 and flat["a.variant"] == "alg1" and flat["a.tracker"] == "StalenessTracker"
    assert config_of(TopKCodec(density=0.1)) == {"class_path": "fl_lightning.compression.topk.TopKCodec", "init_args": {"density": 0.1}}


def test_tensors_are_summarised_by_shape_and_hash():
    a, b = config_of(torch.zeros(2, 3)), config_of(torch.ones(2, 3))
    assert a.startswith("Tensor[2, 3] float32 sha256:") and a != b


def test_recorded_arguments_survive_copy_and_pickle():
    algorithm = FedAvg(server_optimizer=ServerSGD(lr=0.5, momentum=0.9))
    for clone in (copy.deepcopy(algorithm), pickle.loads(pickle.dumps(algorithm))):
        assert clone.hparams() == algorithm.hparams()
