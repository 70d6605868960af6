"""Datasets: in memory as tensors, or naturally partitioned and read one client at a time (LEAF, TFF, FLAIR)."""

from fl_lightning._lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "fl_lightning.data.datasets.in_memory": ("InMemoryDataset",),
        "fl_lightning.data.datasets.digits": ("Digits",),
        "fl_lightning.data.datasets.flair": ("Flair",),
        "fl_lightning.data.datasets.leaf": (
            "LeafCelebA", "LeafDataModule", "LeafFEMNIST", "LeafSent140", "LeafShakespeare",
        ),
        "fl_lightning.data.datasets.mixture": ("RotatedMixture", "SourceMixture", "SyntheticRegressionMixture"),
        "fl_lightning.data.datasets.prioritized_synthetic": ("PrioritizedSynthetic",),
        "fl_lightning.data.datasets.synthetic": ("FedProxSynthetic",),
        "fl_lightning.data.datasets.synthetic_text": ("SyntheticTopicText",),
        "fl_lightning.data.datasets.tff": ("TffCIFAR100", "TffEMNIST", "TffShakespeare", "TffStackOverflow"),
        "fl_lightning.data.datasets.tff_stackoverflow_tags": ("TffStackOverflowTags",),
        "fl_lightning.data.datasets.vision": ("CIFAR10", "CIFAR100", "EMNIST", "MNIST", "SVHN", "FashionMNIST"),
    },
)
