"""The federated datamodule: a centralised dataset, its partition into clients, and their batches."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch
from lightning.pytorch import LightningDataModule
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from torch.utils.data import DataLoader, Dataset, Subset
from typing_extensions import override

from fl_lightning import _lightning_compat as compat
from fl_lightning.data import partition_io
from fl_lightning.data._data_checks import check_int
from fl_lightning.data.batches import ClientBatches, ClientLoading
from fl_lightning.data.loader_settings import federated_loader_settings
from fl_lightning.data.partitioners import IID, Partitioner
from fl_lightning.data.validation_split import ValidationSplit, check_val_fraction, split_validation
from fl_lightning.utils.init_args import RecordsInitArgs

# The user's batch hooks that a federated datamodule runs (Lightning calls them on the trainer's datamodule).
_BATCH_HOOKS = ("on_before_batch_transfer", "transfer_batch_to_device", "on_after_batch_transfer")

# Entropy appended to the seed for the held-out split, so that it is independent of the
# partition, which uses ``default_rng(seed)`` itself.
_HOLDOUT_STREAM = 1


def _overrides(datamodule: LightningDataModule, hook: str) -> bool:
    return getattr(type(datamodule), hook) is not getattr(LightningDataModule, hook)


def datamodule_arguments(datamodule: LightningDataModule) -> dict[str, Any]:
    """The :class:`FederatedDataModule` arguments that federate ``datamodule`` (see
    :meth:`FederatedDataModule.from_datamodule`): its datasets and its loaders' settings."""
    datamodule.prepare_data()
    datamodule.setup("fit")
    source = f"{type(datamodule).__name__}.train_dataloader()"
    train_loader = datamodule.train_dataloader()
    arguments: dict[str, Any] = {"train": train_loader.dataset, **federated_loader_settings(train_loader, source=source)}
    if _overrides(datamodule, "val_dataloader"):
        val_loader = datamodule.val_dataloader()
        arguments["val"] = val_loader.dataset
        if val_loader.batch_size is not None:
            arguments["eval_batch_size"] = val_loader.batch_size
    if _overrides(datamodule, "test_dataloader"):
        datamodule.setup("test")
        arguments["test"] = datamodule.test_dataloader().dataset
    return arguments


def _labels_of(dataset: Dataset) -> np.ndarray:
    """Labels of a dataset without ``targets``: the second tensor of a ``TensorDataset``, else read sample by sample."""
    tensors = getattr(dataset, "tensors", None)
    if tensors is not None and len(tensors) >= 2:
        return host_array(tensors[1])
    return np.asarray([int(dataset[i][1]) for i in range(len(dataset))])  # type: ignore[arg-type]


def host_array(values: Any) -> np.ndarray:
    """``values`` as a NumPy array, copied from the accelerator if it is a tensor there."""
    return values.cpu().numpy() if isinstance(values, torch.Tensor) else np.asarray(values)


class FederatedDataModule(RecordsInitArgs, ClientLoading, LightningDataModule):
    """Partitions a training set among clients and serves each client's batches.

    Three splits, never mixed (``docs/evaluation.md``): the clients' training data; the server's
    validation set (``val_dataloader``: model selection, ``EarlyStopping``, the monitored metric);
    the test set (``test_dataloader``: ``trainer.test()`` only). The validation set is ``val``, or
    with ``val_fraction`` a uniformly random fraction of ``train`` drawn from ``seed`` alone and
    removed *before* partitioning, so no client ever trains on it and it follows the pooled
    training distribution whatever the partitioner. With neither, nothing is validated (a
    warning says so): the test set never stands in for the validation set.

    The partition is computed once, with ``partitioner(..., rng=np.random.default_rng(seed))``
    over the remaining samples, or read from ``partition_file`` when that file exists (and
    written there otherwise). With ``holdout_fraction > 0`` each client then sets aside that
    fraction of its samples (at least one, never all), chosen from ``seed`` alone, as its local
    held-out data; the partition file stores the partition before this split.

    Each client's batches are drawn afresh every local epoch from the trainer's ``(seed, round,
    client)`` generator; with ``shuffle=False`` they follow the partition's order instead, every
    epoch: sorted for a partitioner's partition, the file's order for a partition file (so
    another framework's run can be reproduced sample for sample).

    Args:
        train: The training set; samples are ``(x, y)`` tuples.
        test: The test set, served by ``test_dataloader`` only.
        val: The server's validation set (exclusive with ``val_fraction``).
        val_fraction: Fraction of ``train`` split off as the validation set, in ``(0, 1)``.
        partitioner: How to split ``train``; :class:`~fl_lightning.data.IID` by default.
        num_clients: Number of clients.
        batch_size: Clients' local batch size.
        eval_batch_size: Batch size of the evaluation dataloaders.
        holdout_fraction: Fraction of each client's samples held out, in ``[0, 1)``.
        seed: Seed of the validation split, the partition and the held-out split.
        partition_file: JSON file to load the partition from, or to save it to. Its schema
            (see :mod:`fl_lightning.data.partition_io`) is ``{"num_clients": n, "clients":
            [[i, ...], ...]}``: exactly these two keys, ``num_clients`` equal to this
            datamodule's and to the number of lists, each client a non-empty list of JSON
            integers in ``[0, len(train))``, no index given twice, every training sample (outside
            the validation split) given to a client. A file that breaks it raises ``ValueError``
            naming the file, the client and the entry.
        partial_partition: accept a ``partition_file`` that gives some training samples to no
            client (one written from ``LabelsPerClient``, which can leave labels out, or a subset).
        num_workers: DataLoader workers.
        shuffle: Reshuffle each client's samples every local epoch (``False``: the stored order).
        drop_last: Drop each client's last partial batch in every local epoch (training only;
            evaluation always sees every sample).
        dataloader_kwargs: How samples are loaded and collated, for the clients' batches and the
            evaluation loaders alike: ``collate_fn``, ``pin_memory``, ``persistent_workers``,
            ``worker_init_fn``, ``timeout``, ``prefetch_factor``, ``multiprocessing_context``,
            ``pin_memory_device``, ``in_order`` (DataLoader's meanings). A custom ``collate_fn``
            may return any batch (a dict, a custom object): ``training_step`` receives it as is.
    """

    def __init__(
        self,
        train: Dataset,
        test: Dataset | None = None,
        *,
        val: Dataset | None = None,
        val_fraction: float | None = None,
        partitioner: Partitioner | None = None,
        num_clients: int = 10,
        batch_size: int = 10,
        eval_batch_size: int = 512,
        holdout_fraction: float = 0.0,
        seed: int = 0,
        partition_file: str | None = None,
        partial_partition: bool = False,
        num_workers: int = 0,
        shuffle: bool = True,
        drop_last: bool = False,
        dataloader_kwargs: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self._num_clients = check_int("num_clients", num_clients, minimum=1)
        self._set_client_loading(
            batch_size=batch_size, eval_batch_size=eval_batch_size, num_workers=num_workers, shuffle=shuffle,
            drop_last=drop_last, dataloader_kwargs=dataloader_kwargs,
        )  # fmt: skip
        if not 0 <= holdout_fraction < 1:
            raise ValueError(f"holdout_fraction must be in [0, 1), got {holdout_fraction!r}.")
        if val is not None and val_fraction is not None:
            raise ValueError(
                f"Pass either val (a validation set) or val_fraction (split one off train), not both; got "
                f"val={type(val).__name__} and val_fraction={val_fraction!r}."
            )
        # NumPy seed sequences reject negative entropy.
        self.seed = check_int("seed", seed, minimum=0)
        self.train = train
        self.val = val
        self.val_fraction = None if val_fraction is None else check_val_fraction(val_fraction)
        self._split: ValidationSplit | None = None
        if self.val_fraction is not None:
            self._split = split_validation(self._num_samples(), self.val_fraction, self.seed)
        if num_clients > self._num_client_samples():
            raise ValueError(
                f"num_clients={num_clients} exceeds the {self._num_client_samples()} training samples left to "
                "the clients; every client needs at least one sample."
            )
        self.test = test
        self.partitioner = partitioner if partitioner is not None else IID()
        self.holdout_fraction = float(holdout_fraction)
        self.partition_file = partition_file
        self.partial_partition = partial_partition
        self._full_parts: list[np.ndarray] = []
        self._train_parts: list[np.ndarray] | None = None
        self._holdout_parts: list[np.ndarray] = []
        self.evaluation_clients: list[int] | None = None
        self._warned_no_validation = False
        #: The ``LightningDataModule`` this one federates (see :meth:`from_datamodule`), if any.
        self.datamodule: LightningDataModule | None = None

    @classmethod
    def from_datamodule(
        cls,
        datamodule: LightningDataModule,
        *,
        partitioner: Partitioner | None = None,
        num_clients: int = 10,
        seed: int = 0,
        **kwargs: Any,
    ) -> FederatedDataModule:
        """Federates an ordinary ``LightningDataModule``: its training set is partitioned among
        clients, its validation set becomes the server's validation set and its test set the test set.

        The clients' batches follow the datamodule's ``train_dataloader``: its ``batch_size``,
        ``drop_last``, ``num_workers``, ``collate_fn``, ``pin_memory`` and other loading settings,
        and ``shuffle`` (``RandomSampler``) or not (``SequentialSampler``); any of them can be
        overridden through ``kwargs``. The evaluation loaders use the same loading settings, with
        the batch size of the datamodule's ``val_dataloader`` when it has one. The datamodule's
        own ``on_before_batch_transfer``, ``transfer_batch_to_device`` and ``on_after_batch_transfer``
        run on every batch, as in Lightning (the ``"lean"`` and ``"batched"`` client executors skip
        them in training). A datamodule without ``val_dataloader`` can pass ``val_fraction`` to split
        one off the training set.

        Raises:
            ValueError: The training loader has a setting the federated loop cannot honour (a
                custom sampler or batch sampler, sampling with replacement, an ``IterableDataset``,
                ``batch_size=None``); the message names it.

        Example::

            data = FederatedDataModule.from_datamodule(MyDataModule(), partitioner=Dirichlet(alpha=0.5), num_clients=20)
        """
        arguments = datamodule_arguments(datamodule)
        federated = cls(**{**arguments, **kwargs}, partitioner=partitioner, num_clients=num_clients, seed=seed)
        federated.adopt(datamodule)
        return federated

    def adopt(self, datamodule: LightningDataModule) -> None:
        """Runs ``datamodule``'s batch-transfer hooks on this datamodule's batches, takes its ``hparams``
        untouched (Lightning logs them as it would ``datamodule``'s), and records it as :attr:`datamodule`."""
        self.datamodule = datamodule
        compat.adopt_hparams(self, datamodule)
        for hook in _BATCH_HOOKS:
            if _overrides(datamodule, hook):
                # An instance attribute: Lightning's is_overridden then sees the user's hook, and only
                # hooks the user wrote take precedence over the LightningModule's own.
                setattr(self, hook, getattr(datamodule, hook))

    @property
    def num_clients(self) -> int:
        """Number of clients."""
        return self._num_clients

    @property
    def num_classes(self) -> int | None:
        """The training set's ``num_classes``, if it has one."""
        return getattr(self.train, "num_classes", None)

    @override
    def setup(self, stage: str | None = None) -> None:
        """Partitions the training set; later calls do nothing."""
        if self.datamodule is not None:
            self.datamodule.trainer = self.trainer  # its batch hooks may read the trainer
        if self._train_parts is not None:
            return
        path = self.partition_file
        if path is not None and os.path.exists(path):
            self.load_partition(path)
            return
        rng = np.random.default_rng(self.seed)
        if self._split is None:
            parts = self.partitioner(self._partition_input(), self._num_samples(), self.num_clients, rng)
        else:
            # Partition the pool left after the validation split, then map back to training-set indices.
            pool = self._split.pool
            values = self._partition_input()
            if self.partitioner.needs == "client_ids":
                self._check_no_client_emptied(values, pool)
            parts = self.partitioner(None if values is None else values[pool], len(pool), self.num_clients, rng)
            parts = [pool[np.asarray(part, dtype=np.int64)] for part in parts]
        self._set_partition(parts)
        if path is not None:
            self.save_partition(path)

    @property
    def validation_indices(self) -> np.ndarray:
        """Sorted training-set indices of the validation split (empty unless ``val_fraction`` is set)."""
        return np.empty(0, dtype=np.int64) if self._split is None else self._split.validation

    def client_indices(self, cid: int) -> np.ndarray:
        """Training-set indices of client ``cid``'s training samples (held-out ones excluded), sorted,
        or with ``shuffle=False`` in the order of the partition file they were loaded from."""
        return self._parts()[self._check_cid(cid)]

    def client_num_samples(self, cid: int) -> int:
        """Number of training samples of client ``cid``."""
        return len(self.client_indices(cid))

    def client_batches(
        self,
        cid: int,
        *,
        generator: torch.Generator,
        num_epochs: int | None = None,
        num_batches: int | None = None,
        batch_size: int | None = None,
    ) -> ClientBatches:
        """Client ``cid``'s local batches (of ``batch_size``, default the clients' batch size);
        see :func:`~fl_lightning.data.client_batches` for the semantics."""
        return self._client_batches(
            self.train, self.client_indices(cid), generator=generator, num_epochs=num_epochs, num_batches=num_batches, batch_size=batch_size
        )

    def label_counts(self, cid: int) -> np.ndarray:
        """Number of training samples of each class on client ``cid``."""
        targets = getattr(self.train, "targets", None)
        if targets is None:
            raise ValueError(f"label_counts needs train.targets; {type(self.train).__name__} has none.")
        targets = host_array(targets)
        labels = targets[self.client_indices(cid)]
        num_classes = self.num_classes or int(np.max(targets)) + 1
        return np.bincount(labels, minlength=num_classes)

    def holdout_dataloader(self, cid: int) -> DataLoader[Any]:
        """Client ``cid``'s held-out samples, in order, with ``eval_batch_size``."""
        if self.holdout_fraction == 0:
            raise RuntimeError("there is no held-out data: set holdout_fraction > 0.")
        self._parts()
        return self._loader(Subset(self.train, self._holdout_parts[self._check_cid(cid)].tolist()), shuffle=False)

    def save_partition(self, path: str | os.PathLike[str]) -> None:
        """Writes the partition (before the held-out split) as JSON."""
        self._parts()
        partition_io.save_partition(self._full_parts, path)

    def load_partition(self, path: str | os.PathLike[str]) -> None:
        """Replaces the partition by the one in ``path``, validated against this datamodule (each
        client's indices sorted, or kept in the file's order with ``shuffle=False``)."""
        num_samples = self._num_samples()
        cover = None if self.partial_partition else np.setdiff1d(np.arange(num_samples), self.validation_indices)
        parts = partition_io.load_partition(
            path, num_clients=self.num_clients, num_samples=num_samples, keep_order=not self.shuffle, cover=cover
        )
        leaked = np.intersect1d(np.concatenate(parts), self.validation_indices)
        if leaked.size:
            raise ValueError(
                f"partition file {str(path)!r} gives {leaked.size} validation samples (e.g. index {leaked[0]}) to "
                f"clients, but val_fraction={self.val_fraction} reserves them for the server: it was written "
                "with another val_fraction or seed; delete it to partition again."
            )
        self._set_partition(parts)

    @override
    def train_dataloader(self) -> DataLoader[Any]:
        """All clients' training samples pooled and shuffled, for Lightning's fit loop to hold.

        The federated loop trains on :meth:`client_batches` instead.
        """
        pooled = np.sort(np.concatenate(self._parts()))
        return self._loader(
            Subset(self.train, pooled.tolist()), shuffle=self.shuffle, batch_size=self.batch_size, drop_last=self.drop_last
        )

    def set_evaluation_clients(self, clients: list[int] | None) -> None:
        """Validates the global model on these clients' held-out samples instead of the validation set.

        Used when the objective is a subset of the clients (e.g. after arrivals or departures);
        ``None`` restores the validation set. Needs ``holdout_fraction > 0``. The test set is unaffected.
        """
        if clients is not None:
            if self.holdout_fraction == 0:
                raise ValueError("Evaluating on clients' held-out data needs holdout_fraction > 0.")
            clients = sorted(self._check_cid(c) for c in clients)
        self.evaluation_clients = clients

    @override
    def val_dataloader(self) -> DataLoader[Any] | list[Any]:
        """The server's validation set for the global model, or the held-out samples of
        :attr:`evaluation_clients` when set; none (with a one-time warning) without either."""
        if self.evaluation_clients is not None:
            self._parts()
            held = np.concatenate([self._holdout_parts[c] for c in self.evaluation_clients])
            return self._loader(Subset(self.train, np.sort(held).tolist()), shuffle=False)
        if self.val is not None:
            return self._loader(self.val, shuffle=False)
        if self._split is not None:
            return self._loader(Subset(self.train, self._split.validation.tolist()), shuffle=False)
        if not self._warned_no_validation:
            self._warned_no_validation = True
            rank_zero_warn(
                "FederatedDataModule has no validation set, so the global model is not validated and no model "
                "selection (ModelCheckpoint/EarlyStopping monitor) can happen; the test set is never used in its "
                "place. Pass val=... or val_fraction=... (e.g. 0.1)."
            )
        return []

    @override
    def test_dataloader(self) -> DataLoader[Any]:
        """The test set, for ``trainer.test()`` (and the opt-in :class:`~fl_lightning.callbacks.TestCurve`)."""
        return self._loader(self._test_set(), shuffle=False)

    def _set_partition(self, parts: list[np.ndarray]) -> None:
        for part in parts:
            # client_indices hands these arrays out; a caller editing one would corrupt the partition.
            part.flags.writeable = False
        self._full_parts = parts
        if self.holdout_fraction == 0:
            self._train_parts = parts
            self._holdout_parts = [np.empty(0, dtype=np.int64) for _ in parts]
            return
        rng = np.random.default_rng([self.seed, _HOLDOUT_STREAM])
        self._train_parts, self._holdout_parts = [], []
        for part in parts:
            num_held = min(len(part) - 1, max(1, round(self.holdout_fraction * len(part))))
            # Drawn from the sorted indices, so the held-out samples do not depend on the stored order.
            held = np.sort(rng.permutation(np.sort(part))[:num_held])
            kept = part[~np.isin(part, held, assume_unique=True)]  # the remaining samples, in stored order
            held.flags.writeable = kept.flags.writeable = False
            self._holdout_parts.append(held)
            self._train_parts.append(kept)

    def _num_samples(self) -> int:
        return len(self.train)  # type: ignore[arg-type]

    def _num_client_samples(self) -> int:
        return self._num_samples() if self._split is None else len(self._split.pool)

    def _parts(self) -> list[np.ndarray]:
        # Partitions on first use, so the datamodule also works outside a Trainer.
        if self._train_parts is None:
            self.setup()
        assert self._train_parts is not None
        return self._train_parts

    def _check_no_client_emptied(self, client_ids: np.ndarray, pool: np.ndarray) -> None:
        """Raises ``ValueError`` if the validation split took every training sample of one of the dataset's own clients."""
        emptied = np.setdiff1d(client_ids, client_ids[pool])
        if len(emptied):
            shown = ", ".join(str(c) for c in emptied[:10]) + (", ..." if len(emptied) > 10 else "")
            raise ValueError(
                f"val_fraction={self.val_fraction} took every training sample of {len(emptied)} of the dataset's own "
                f"clients (client ids {shown}), which {type(self.partitioner).__name__} partitioning by client id cannot "
                "drop: lower val_fraction, give every "
                "client more samples, or pass a separate val dataset."
            )

    def _partition_input(self) -> np.ndarray | None:
        needs = self.partitioner.needs
        if needs == "none":
            return None
        attribute = "targets" if needs == "targets" else "client_ids"
        values = getattr(self.train, attribute, None)
        if values is None and needs == "targets":
            values = _labels_of(self.train)
        if values is None:
            raise ValueError(f"{self.partitioner!r} needs train.{attribute}, which {type(self.train).__name__} lacks.")
        return host_array(values)

    def _check_cid(self, cid: int) -> int:
        if not 0 <= cid < self.num_clients:
            raise IndexError(f"client id {cid} is outside [0, {self.num_clients}).")
        return cid

    def _test_set(self) -> Dataset[Any]:
        if self.test is None:
            raise RuntimeError("FederatedDataModule has no test set; pass test=... to test the global model.")
        return self.test

    def _loader(
        self, dataset: Dataset[Any], *, shuffle: bool, batch_size: int | None = None, drop_last: bool = False
    ) -> DataLoader[Any]:
        return DataLoader(
            dataset,
            batch_size=batch_size or self.eval_batch_size,
            shuffle=shuffle,
            drop_last=drop_last,
            num_workers=self.num_workers,
            **self.dataloader_kwargs,
        )
