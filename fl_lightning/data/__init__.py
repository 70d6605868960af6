"""Federated data: partitioners, in-memory datasets, natural partitions (LEAF, TFF), client batch streams and the datamodules."""

from fl_lightning._lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "fl_lightning.data.batches": ("ClientBatches", "client_batches"),
        "fl_lightning.data.datamodule": ("FederatedDataModule",),
        "fl_lightning.data.client_reader": ("ClientReader",),
        "fl_lightning.data.federated": ("Federated",),
        "fl_lightning.data.natural": ("NaturalDataModule",),
        "fl_lightning.data.datasets": (
            "CIFAR10", "CIFAR100", "EMNIST", "MNIST", "SVHN", "Digits", "FashionMNIST", "FedProxSynthetic", "Flair",
            "InMemoryDataset", "LeafCelebA", "LeafFEMNIST", "LeafSent140", "LeafShakespeare", "RotatedMixture",
            "SourceMixture", "SyntheticRegressionMixture", "SyntheticTopicText", "PrioritizedSynthetic", "TffCIFAR100",
            "TffEMNIST", "TffShakespeare", "TffStackOverflow", "TffStackOverflowTags",
        ),
        "fl_lightning.data.partitioners": (
            "IID", "Dirichlet", "ExponentialSizes", "GroupedNatural", "IdToSize", "InnerDirichlet", "LabelsPerClient",
            "LinearSizes", "Natural", "ParetoSizes", "Partitioner", "Pathological", "Shards", "Sizes", "SquareSizes",
        ),
        "fl_lightning.data.label_groups": ("LabelGroups",),
    },
)
