"""Datasets: in memory as tensors, or naturally partitioned and read one client at a time (LEAF, TFF, FLAIR)."""

from fl_lightning.data.datasets.in_memory import InMemoryDataset
from fl_lightning.data.datasets.digits import Digits
from fl_lightning.data.datasets.flair import Flair
from fl_lightning.data.datasets.leaf import LeafCelebA, LeafDataModule, LeafFEMNIST, LeafSent140, LeafShakespeare
from fl_lightning.data.datasets.mixture import RotatedMixture, SourceMixture, SyntheticRegressionMixture
from fl_lightning.data.datasets.prioritized_synthetic import PrioritizedSynthetic
from fl_lightning.data.datasets.synthetic import FedProxSynthetic
from fl_lightning.data.datasets.synthetic_text import SyntheticTopicText
from fl_lightning.data.datasets.tff import TffCIFAR100, TffEMNIST, TffShakespeare, TffStackOverflow
from fl_lightning.data.datasets.tff_stackoverflow_tags import TffStackOverflowTags
from fl_lightning.data.datasets.vision import CIFAR10, CIFAR100, EMNIST, MNIST, SVHN, FashionMNIST

__all__ = [
    "CIFAR10",
    "CIFAR100",
    "EMNIST",
    "MNIST",
    "SVHN",
    "Digits",
    "FashionMNIST",
    "FedProxSynthetic",
    "Flair",
    "InMemoryDataset",
    "LeafCelebA",
    "LeafDataModule",
    "LeafFEMNIST",
    "LeafSent140",
    "LeafShakespeare",
    "RotatedMixture",
    "SourceMixture",
    "SyntheticRegressionMixture",
    "SyntheticTopicText",
    "PrioritizedSynthetic",
    "TffCIFAR100",
    "TffEMNIST",
    "TffShakespeare",
    "TffStackOverflow",
    "TffStackOverflowTags",
]
