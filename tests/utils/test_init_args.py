"""Constructor arguments are recorded by every configurable piece and flattened into hyper-parameters."""

from __future__ import annotations

import copy
import pickle

import torch

from fl_lightning import FedALIGN, FedAvg, FedBuff, FedMRN, FedProx, FedStaleWeight, ServerAdam, ServerSGD
from fl_lightning.data import Dirichlet, FederatedDataModule, FedProxSynthetic
from fl_lightning.participation import ConstantDelay
from fl_lightning.utils.init_args import RecordsInitArgs, flat_hparams


class _Piece(RecordsInitArgs):
    def __init__(self, a: int, b: str = "x", *rest: int, **extra: float) -> None:
        self.a = a


def test_records_arguments_with_defaults_varargs_and_merged_kwargs() -> None:
    assert _Piece(1, "y", 2, 3, c=0.5).init_args == {"a": 1, "b": "y", "rest": (2, 3), "c": 0.5}
    assert _Piece(a=4).init_args == {"a": 4, "b": "x", "rest": ()}


def test_the_record_survives_copy_and_pickle() -> None:
    piece = _Piece(7, c=1.0)
    for clone in (copy.copy(piece), copy.deepcopy(piece), pickle.loads(pickle.dumps(piece))):
        assert clone.init_args == piece.init_args and clone.a == 7


def test_nested_objects_flatten_into_dotted_keys() -> None:
    flat = flat_hparams("fl/algorithm", FedAvg(server_optimizer=ServerAdam(lr=0.01)))
    assert flat["fl/algorithm"] == "FedAvg"
    assert flat["fl/algorithm.server_optimizer"] == "ServerAdam"
    assert flat["fl/algorithm.server_optimizer.lr"] == 0.01
    assert flat["fl/algorithm.server_optimizer.beta1"] == 0.9  # defaults are logged too


def test_wrapped_algorithms_codecs_and_delay_models_are_described() -> None:
    assert flat_hparams("a", FedALIGN(algorithm=FedProx(mu=0.1), epsilon=0.3))["a.algorithm.mu"] == 0.1
    assert flat_hparams("a", FedMRN())["a"] == "FedMRN"
    assert flat_hparams("a", FedBuff(delays=ConstantDelay(2.0), buffer_size=3))["a.delays.duration"] == 2.0


def test_values_of_every_kind() -> None:
    big = torch.zeros(4, 5)
    assert flat_hparams("k", {"t": torch.tensor([1.0, 2.0]), "big": big, "l": [1, None, "a"], "objs": [_Piece(1)], "f": len}) == {
        "k.t": [1.0, 2.0],
        "k.big": flat_hparams("x", torch.zeros(4, 5))["x"],
        "k.l": [1, None, "a"],
        "k.objs.0": "_Piece",
        "k.objs.0.a": 1,
        "k.objs.0.b": "x",
        "k.objs.0.rest": [],
        "k.f": "len",
    }


def test_large_tensors_show_their_shape_and_a_hash_of_their_values() -> None:
    zeros, ones = flat_hparams("t", torch.zeros(4, 5))["t"], flat_hparams("t", torch.ones(4, 5))["t"]
    assert zeros.startswith("Tensor[4, 5] sha256:") and zeros != ones


def test_a_none_argument_the_constructor_replaced_by_a_default_object_is_described_as_that_object() -> None:
    flat = flat_hparams("a", FedProx(mu=0.3))
    assert (flat["a.server_optimizer"], flat["a.server_optimizer.lr"], flat["a.server_optimizer.momentum"]) == ("ServerSGD", 1.0, 0.0)
    assert flat_hparams("a", FedAvg(server_optimizer=ServerSGD()))["a.server_optimizer"] == "ServerSGD"


def test_kwargs_forwarded_to_a_parent_are_recorded_when_given() -> None:
    flat = flat_hparams("a", FedStaleWeight(variant="alg1", buffer_size=3))
    assert (flat["a"], flat["a.variant"], flat["a.buffer_size"]) == ("FedStaleWeight", "alg1", 3)


def test_the_datamodule_records_its_partitioner_and_dataset() -> None:
    data = FederatedDataModule(FedProxSynthetic(alpha=0.5, beta=0.5, num_clients=4), partitioner=Dirichlet(alpha=0.3), num_clients=4)
    flat = flat_hparams("fl/data", data)
    assert flat["fl/data.partitioner"] == "Dirichlet" and flat["fl/data.partitioner.alpha"] == 0.3
    assert flat["fl/data.train"] == "FedProxSynthetic" and flat["fl/data.train.alpha"] == 0.5
    assert flat["fl/data.num_clients"] == 4
