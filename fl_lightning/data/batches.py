"""The stream of mini-batches a client trains on in one round."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from itertools import chain, repeat
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from fl_lightning.data._data_checks import check_bool, check_int
from fl_lightning.data.augment import augmentation_generator
from fl_lightning.data.loader_settings import check_dataloader_kwargs


class ClientBatches:
    """The mini-batches a client trains on: ``num_epochs`` epochs or the first ``num_batches`` batches.

    The client's samples ``dataset[indices[i]]`` form an endless stream of epochs. Each epoch
    draws a fresh permutation ``torch.randperm(len(indices), generator=generator)`` and cuts it,
    in order, into batches of ``batch_size``, keeping the last partial batch. With
    ``num_epochs=E`` the stream is ``E`` epochs; with ``num_batches=S`` it is the first ``S``
    batches, crossing epoch boundaries as needed and drawing exactly
    ``ceil(S / batches_per_epoch)`` permutations. Batch ``j`` of an epoch with permutation ``p``
    holds the samples ``indices[p[j*batch_size : (j+1)*batch_size]]``. With ``shuffle=False``
    every epoch is ``indices`` in the given order (``p`` is ``arange``; nothing is drawn), and with
    ``drop_last=True`` each epoch's last partial batch is dropped (a client with fewer than
    ``batch_size`` samples then has no batches at all).

    The permutations are drawn while iterating, from ``generator``'s current state: iterating
    twice gives two different streams, and the generator's state afterwards depends only on the
    number of permutations drawn.

    A dataset with a ``train_transform`` (``(images, generator) -> images``, e.g.
    ``CIFAR10(augment=True)``) has it applied to every batch's inputs, drawing from a generator
    seeded by ``generator.initial_seed()`` (the client's data seed), so augmentation is as
    deterministic as the data order and does not shift it. It applies to every stream cut
    from the dataset, loss probes included.

    Datasets with a ``tensors`` attribute (such as :class:`~fl_lightning.data.InMemoryDataset`)
    are batched by indexing each tensor once per batch. Other datasets go through a
    :class:`~torch.utils.data.DataLoader` with ``num_workers`` workers yielding the same
    batches; that DataLoader draws its worker seed from the global torch RNG, as usual. So do
    all datasets when ``dataloader_kwargs`` is given, which is forwarded to that DataLoader.

    Args:
        dataset: Map-style dataset whose samples are ``(x, y)`` tuples.
        indices: The client's dataset indices.
        batch_size: Samples per batch.
        generator: Source of the permutations.
        num_epochs: Number of passes over the client's samples.
        num_batches: Number of batches.
        num_workers: DataLoader workers, for datasets without ``tensors``.
        shuffle: Draw a permutation every epoch (``True``) or keep the order of ``indices``.
        drop_last: Drop each epoch's last batch if it is partial.
        dataloader_kwargs: How samples are loaded and collated (``collate_fn``, ``pin_memory``,
            ``persistent_workers``, ``worker_init_fn``, ...; see
            :data:`~fl_lightning.data.loader_settings.LOADING_DEFAULTS`).

    Iterating yields the batches, ``(x, y)`` tuples or what ``collate_fn`` returns; ``len`` counts them.

    Example:
        >>> import torch
        >>> from torch.utils.data import TensorDataset
        >>> data = TensorDataset(torch.arange(10.0), torch.arange(10))
        >>> batches = client_batches(data, [2, 3, 5], batch_size=2, num_batches=3,
        ...                          generator=torch.Generator().manual_seed(0))
        >>> len(batches), [len(y) for _, y in batches]
        (3, [2, 1, 2])
    """

    def __init__(
        self,
        dataset: Dataset[Any],
        indices: np.ndarray | Sequence[int],
        *,
        batch_size: int,
        generator: torch.Generator,
        num_epochs: int | None = None,
        num_batches: int | None = None,
        num_workers: int = 0,
        shuffle: bool = True,
        drop_last: bool = False,
        dataloader_kwargs: dict[str, Any] | None = None,
    ) -> None:
        if (num_epochs is None) == (num_batches is None):
            raise ValueError(
                f"pass exactly one of num_epochs and num_batches, got num_epochs={num_epochs!r}, "
                f"num_batches={num_batches!r}."
            )
        self.batch_size = check_int("batch_size", batch_size, minimum=1)
        self.num_epochs = None if num_epochs is None else check_int("num_epochs", num_epochs, minimum=0)
        self.num_batches = None if num_batches is None else check_int("num_batches", num_batches, minimum=0)
        self.num_workers = check_int("num_workers", num_workers, minimum=0)
        self.shuffle = check_bool("shuffle", shuffle)
        self.drop_last = check_bool("drop_last", drop_last)
        self.dataloader_kwargs = check_dataloader_kwargs(dataloader_kwargs)
        # A copy: torch cannot wrap the datamodule's read-only index arrays without warning.
        self.indices = torch.from_numpy(np.array(indices, dtype=np.int64).reshape(-1))
        if self.indices.numel() == 0:
            raise ValueError("indices is empty; a client needs at least one sample to form batches.")
        self.dataset = dataset
        self.generator = generator
        # Duck-typed so that any TensorDataset-like dataset gets the fast path; a custom collate or
        # pinning needs the DataLoader.
        tensors = None if self.dataloader_kwargs else getattr(dataset, "tensors", None)
        self._tensors: tuple[Tensor, ...] | None = tuple(tensors) if tensors is not None else None
        # Tensors on an accelerator are gathered there: indices move once per client, permutations
        # once per epoch (drawn on the CPU generator, so the order does not depend on the device).
        self._device = self._tensors[0].device if self._tensors else torch.device("cpu")
        self.indices = self.indices.to(self._device)
        # A dataset's batch-level training augmentation (e.g. CIFAR10(augment=True)), seeded by the client's data seed.
        self.transform: Callable[[Tensor, torch.Generator], Tensor] | None = getattr(dataset, "train_transform", None)
        self._augment_generator = None if self.transform is None else augmentation_generator(generator)

    @property
    def device(self) -> torch.device | None:
        """The device of every batch's tensors: the dataset's tensors' (indexed there); ``None`` for batches a
        DataLoader collates, whose device the collate function decides."""
        return self._device if self._tensors is not None else None

    @property
    def batches_per_epoch(self) -> int:
        """Number of batches in one pass over the client's samples: the last one is partial, or
        dropped with ``drop_last``."""
        samples = self.indices.shape[0]  # not len(): Tensor.__len__ is a Python call
        return samples // self.batch_size if self.drop_last else -(-samples // self.batch_size)

    def __len__(self) -> int:
        if self.num_batches is not None:
            # With drop_last, a client smaller than a batch has none to give.
            return self.num_batches if self.batches_per_epoch else 0
        assert self.num_epochs is not None
        return self.num_epochs * self.batches_per_epoch

    def __iter__(self) -> Iterator[Any]:
        if self._tensors is None:
            return self._loaded()
        # Each epoch's batches as one zip of per-tensor maps, epochs chained lazily: the batch tuples are built in C,
        # without a Python frame per step.
        batches = chain.from_iterable(
            zip(*[_rows(tensor, epoch) for tensor in self._tensors]) for epoch in self.epoch_batches()
        )
        return batches if self.transform is None else map(self._augmented, batches)

    def _loaded(self) -> Iterator[Any]:
        loader = DataLoader(
            self.dataset, batch_sampler=_IndexBatches(self), num_workers=self.num_workers, **self.dataloader_kwargs
        )
        for batch in loader:
            # default_collate turns (x, y) samples into a list; a custom collate's batch is kept as it is.
            yield self._augmented(tuple(batch)) if isinstance(batch, list) else batch

    def _augmented(self, batch: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
        if self.transform is None:
            return batch
        assert self._augment_generator is not None
        return (self.transform(batch[0], self._augment_generator), *batch[1:])

    def epoch_batches(self) -> Iterator[list[Tensor]]:
        """Yields each epoch's batches of dataset indices (the last epoch's cut to the stream's length), drawing the
        epoch's permutation as it starts: a stream ending on an epoch boundary draws no extra one."""
        left, per_epoch = len(self), self.batches_per_epoch
        while left:
            if self.shuffle:
                order = torch.randperm(self.indices.shape[0], generator=self.generator).to(self._device)
                epoch = self.indices.index_select(0, order)
            else:
                epoch = self.indices
            # Slices (views), only those the stream still needs: half of tensor_split's cost for a few batches.
            size = self.batch_size
            batches = [epoch[start : start + size] for start in range(0, min(per_epoch, left) * size, size)]
            left -= len(batches)
            yield batches

    def index_batches(self) -> Iterator[Tensor]:
        """Yields the dataset indices of each batch, drawing each epoch's permutation lazily."""
        for epoch in self.epoch_batches():
            yield from epoch


def _rows(tensor: Any, batches: list[Tensor]) -> Iterator[Any]:
    """``tensor[b]`` for each index batch ``b``: ``index_select(0, b)`` for a plain tensor (the same rows in a new
    contiguous tensor, without advanced indexing's set-up, a third of its time on a small batch), else its own
    ``__getitem__`` (a tensor subclass's, or a dataset's row container's such as
    :class:`~fl_lightning.data.datasets.multi_hot.MultiHotRows`)."""
    return map(tensor.index_select, repeat(0), batches) if type(tensor) is Tensor else map(tensor.__getitem__, batches)


class _IndexBatches:
    """Adapts :meth:`ClientBatches.index_batches` to a DataLoader ``batch_sampler``."""

    def __init__(self, batches: ClientBatches) -> None:
        self._batches = batches

    def __iter__(self) -> Iterator[list[int]]:
        for batch in self._batches.index_batches():
            yield batch.tolist()

    def __len__(self) -> int:
        return len(self._batches)


# The functional spelling of the public API: calling the class, with its signature and docs.
client_batches = ClientBatches


class ClientLoading:
    """The settings by which a federated data module cuts each client's samples into batches, checked once
    (:meth:`_set_client_loading`), and the cut (:meth:`_client_batches`): shared by
    :class:`~fl_lightning.data.FederatedDataModule` and :class:`~fl_lightning.data.natural.NaturalDataModule`."""

    batch_size: int
    eval_batch_size: int
    num_workers: int
    shuffle: bool
    drop_last: bool
    dataloader_kwargs: dict[str, Any]

    def _set_client_loading(
        self,
        *,
        batch_size: int,
        eval_batch_size: int,
        num_workers: int,
        shuffle: bool,
        drop_last: bool,
        dataloader_kwargs: dict[str, Any] | None,
    ) -> None:
        self.batch_size = check_int("batch_size", batch_size, minimum=1)
        self.eval_batch_size = check_int("eval_batch_size", eval_batch_size, minimum=1)
        self.num_workers = check_int("num_workers", num_workers, minimum=0)
        self.shuffle = check_bool("shuffle", shuffle)
        self.drop_last = check_bool("drop_last", drop_last)
        self.dataloader_kwargs = check_dataloader_kwargs(dataloader_kwargs)

    def _client_batches(
        self,
        dataset: Any,
        indices: np.ndarray,
        *,
        generator: torch.Generator,
        num_epochs: int | None,
        num_batches: int | None,
        batch_size: int | None,
    ) -> ClientBatches:
        """``indices`` of ``dataset`` as one client's local batches (``batch_size``, default the clients' batch size)."""
        return client_batches(
            dataset,
            indices,
            batch_size=batch_size or self.batch_size,
            generator=generator,
            num_epochs=num_epochs,
            num_batches=num_batches,
            num_workers=self.num_workers,
            shuffle=self.shuffle,
            drop_last=self.drop_last,
            dataloader_kwargs=self.dataloader_kwargs,
        )

