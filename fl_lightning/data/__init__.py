"""Federated data: partitioners, in-memory datasets, client batch streams and the datamodule."""

from fl_lightning.data.batches import ClientBatches, client_batches
from fl_lightning.data.datamodule import FederatedDataModule
from fl_lightning.data.datasets import (
    CIFAR10,
    CIFAR100,
    EMNIST,
    MNIST,
    SVHN,
    Digits,
    FashionMNIST,
    FedProxSynthetic,
    InMemoryDataset,
)
from fl_lightning.data.partitioners import IID, Dirichlet, LabelsPerClient, Natural, ParetoSizes, Partitioner, Shards

__all__ = [
    "CIFAR10",
    "CIFAR100",
    "EMNIST",
    "IID",
    "MNIST",
    "SVHN",
    "ClientBatches",
    "Digits",
    "Dirichlet",
    "FashionMNIST",
    "FedProxSynthetic",
    "FederatedDataModule",
    "InMemoryDataset",
    "LabelsPerClient",
    "Natural",
    "ParetoSizes",
    "Partitioner",
    "Shards",
    "client_batches",
]
