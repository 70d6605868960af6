"""Federated data: partitioners, in-memory datasets, natural partitions (LEAF, TFF), client batch streams and the datamodules."""

from fl_lightning.data.batches import ClientBatches, client_batches
from fl_lightning.data.datamodule import FederatedDataModule
from fl_lightning.data.client_reader import ClientReader
from fl_lightning.data.federated import Federated
from fl_lightning.data.natural import NaturalDataModule
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
    LeafCelebA,
    LeafFEMNIST,
    LeafSent140,
    LeafShakespeare,
    RotatedMixture,
    SourceMixture,
    SyntheticRegressionMixture,
    SyntheticTopicText,
    PrioritizedSynthetic,
    TffCIFAR100,
    TffEMNIST,
    TffShakespeare,
    TffStackOverflow,
    TffStackOverflowTags,
)
from fl_lightning.data.partitioners import IID, Dirichlet, LabelsPerClient, Natural, ParetoSizes, Partitioner, Shards
from fl_lightning.data.label_groups import LabelGroups

__all__ = [
    "CIFAR10",
    "CIFAR100",
    "EMNIST",
    "IID",
    "MNIST",
    "SVHN",
    "ClientBatches",
    "ClientReader",
    "Digits",
    "Dirichlet",
    "FashionMNIST",
    "FedProxSynthetic",
    "Federated",
    "FederatedDataModule",
    "InMemoryDataset",
    "LabelGroups",
    "LabelsPerClient",
    "LeafCelebA",
    "LeafFEMNIST",
    "LeafSent140",
    "LeafShakespeare",
    "Natural",
    "NaturalDataModule",
    "ParetoSizes",
    "Partitioner",
    "RotatedMixture",
    "SourceMixture",
    "SyntheticRegressionMixture",
    "SyntheticTopicText",
    "PrioritizedSynthetic",
    "Shards",
    "TffCIFAR100",
    "TffEMNIST",
    "TffShakespeare",
    "TffStackOverflow",
    "TffStackOverflowTags",
    "client_batches",
]
