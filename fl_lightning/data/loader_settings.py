"""The DataLoader settings that federated data honours, and reading them off a user's DataLoader.

The federated loop owns *which* samples a client sees and in what order (its partition and the
``(seed, round, client)`` generator), so a DataLoader's sampler, batch sampler and generator have
no place in it. Everything about *how* samples are loaded and collated carries over unchanged.
"""

from __future__ import annotations

from typing import Any

from torch.utils.data import BatchSampler, DataLoader, IterableDataset, RandomSampler, SequentialSampler
from torch.utils.data._utils.collate import default_collate

#: ``DataLoader`` keyword arguments forwarded to every loader the federated data builds (how
#: samples are loaded and collated), with their defaults.
LOADING_DEFAULTS: dict[str, Any] = {
    "collate_fn": None,
    "pin_memory": False,
    "timeout": 0,
    "worker_init_fn": None,
    "multiprocessing_context": None,
    "prefetch_factor": None,
    "persistent_workers": False,
    "pin_memory_device": "",
    "in_order": True,
}


def check_dataloader_kwargs(kwargs: dict[str, Any] | None) -> dict[str, Any]:
    """``kwargs`` as a new dict, or ``ValueError`` naming a key that is not a loading setting."""
    kwargs = dict(kwargs or {})
    unknown = sorted(set(kwargs) - set(LOADING_DEFAULTS))
    if unknown:
        raise ValueError(
            f"dataloader_kwargs got {unknown}; allowed keys are {sorted(LOADING_DEFAULTS)}. Batch size, shuffling "
            "and drop_last are the datamodule's own arguments; samplers are not allowed (the federated loop owns the order)."
        )
    return kwargs


def federated_loader_settings(loader: DataLoader[Any], *, source: str) -> dict[str, Any]:
    """The :class:`~fl_lightning.data.FederatedDataModule` arguments that reproduce ``loader``'s batches.

    Returns ``batch_size``, ``shuffle`` (a ``RandomSampler`` or a ``SequentialSampler``),
    ``drop_last``, ``num_workers`` and ``dataloader_kwargs`` (the loading settings that differ
    from DataLoader's defaults). The loader's ``generator`` is not carried over: the trainer's
    ``seed`` orders the clients' data.

    Args:
        loader: The user's training DataLoader.
        source: Where it came from, for error messages (e.g. ``"MyDataModule.train_dataloader()"``).

    Raises:
        ValueError: A setting the federated loop cannot honour: an ``IterableDataset``, no batch
            size, a custom sampler or batch sampler, or sampling with replacement.
    """
    if not isinstance(loader, DataLoader):
        raise ValueError(f"{source} must return one torch DataLoader to federate, got {type(loader).__name__}.")
    if isinstance(loader.dataset, IterableDataset):
        raise ValueError(
            f"{source} loads an IterableDataset ({type(loader.dataset).__name__}), which cannot be partitioned "
            "among clients; federate a map-style dataset (with __getitem__ and __len__)."
        )
    # DataLoader leaves batch_size None when it was given a batch_sampler, or no batching at all.
    if loader.batch_size is None or type(loader.batch_sampler) is not BatchSampler:
        found = "none (batch_size=None)" if loader.batch_sampler is None else f"{type(loader.batch_sampler).__name__} (custom)"
        raise ValueError(
            f"{source} has batch_sampler {found}, which cannot be honoured: federated clients are batched by the "
            "datamodule's batch_size and drop_last, so only DataLoader(batch_size=..., drop_last=...) can be federated."
        )
    sampler = loader.sampler
    # RandomSampler's public num_samples defaults to len(data); only the private field says it was set.
    if type(sampler) is RandomSampler and not sampler.replacement and sampler._num_samples is None:
        shuffle = True
    elif type(sampler) is SequentialSampler:
        shuffle = False
    else:
        raise ValueError(
            f"{source} has sampler {type(sampler).__name__}"
            f"{' with replacement or num_samples' if isinstance(sampler, RandomSampler) else ''}, which cannot be "
            "honoured: the federated loop owns each client's order. Use shuffle=True or shuffle=False instead."
        )
    loading = {name: getattr(loader, name) for name in LOADING_DEFAULTS}
    if loading["collate_fn"] is default_collate:
        loading["collate_fn"] = None
    if loader.num_workers > 0 and loading["prefetch_factor"] == 2:  # DataLoader's default with workers
        loading["prefetch_factor"] = None
    return {
        "batch_size": loader.batch_size,
        "shuffle": shuffle,
        "drop_last": loader.drop_last,
        "num_workers": loader.num_workers,
        "dataloader_kwargs": {name: value for name, value in loading.items() if value != LOADING_DEFAULTS[name]},
    }
