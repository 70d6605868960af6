"""The data module of naturally partitioned sources: the clients are the data's own users, read lazily."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from lightning.pytorch import LightningDataModule
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from torch.utils.data import DataLoader, Dataset

from fl_lightning.data._data_checks import check_bool, check_int
from fl_lightning.data.batches import ClientBatches, ClientLoading
from fl_lightning.data.client_reader import ClientFraction, ClientReader, ClientSamples, PooledClients
from fl_lightning.data.validation_split import check_val_fraction
from fl_lightning.utils.init_args import RecordsInitArgs


class NaturalDataModule(RecordsInitArgs, ClientLoading, LightningDataModule):
    """Clients that are the source's own users (writers, speakers, posters), read one at a time.

    Client ``c`` is the ``c``-th client of ``train`` (readers list their clients sorted by id). Only
    the index (ids and sample counts) is in memory; a client's samples are read when it trains
    (:meth:`client_batches`) or is evaluated, and dropped afterwards, so host memory is flat in the
    number of clients. Batching and seeding are :func:`~fl_lightning.data.client_batches`', exactly
    as in :class:`~fl_lightning.data.FederatedDataModule`.

    Three splits, never mixed (``docs/evaluation.md``):

    - training: ``train`` (with ``val_fraction``, less each client's validation samples);
    - validation (``val_dataloader``): the source's own held-out split ``val`` (StackOverflow's
      ``heldout``), or with ``val_fraction`` that fraction of every client's training samples (at
      least one, never all; none of a one-sample client), drawn from ``(seed, client)``; with
      neither, nothing is validated (a warning says so) and the test split never stands in;
    - test (``test_dataloader``, ``trainer.test()``): ``test`` pooled over its clients. Client ``c``'s
      own test samples (those of the test client with its id) are its held-out data
      (:meth:`holdout_dataloader`, for :class:`~fl_lightning.callbacks.FederatedEvaluation`); a client
      absent from ``test`` has none, and with ``test_by_client=False`` (test clients that are other
      users, whatever their ids) no client has any.

    Args:
        train: The clients' training split.
        test: The test split (the same users as ``train`` in LEAF and TFF EMNIST, other users in StackOverflow).
        test_by_client: Whether a test client is the training client with the same id (``False`` for
            TFF CIFAR-100, whose test clients are other partitions numbered from 0 again).
        val: The source's held-out split for the server's validation (exclusive with ``val_fraction``).
        val_fraction: Fraction of each client's training samples set aside for the server's validation, in ``(0, 1)``.
        batch_size: Clients' local batch size.
        eval_batch_size: Batch size of the evaluation loaders.
        seed: Seed of the ``val_fraction`` split.
        num_workers: DataLoader workers.
        shuffle: Reshuffle each client's samples every local epoch (``False``: the source's order).
        drop_last: Drop each client's last partial batch in every local epoch.
        dataloader_kwargs: How samples are loaded and collated (see :class:`~fl_lightning.data.FederatedDataModule`).
    """

    def __init__(
        self,
        train: ClientReader,
        test: ClientReader | None = None,
        *,
        test_by_client: bool = True,
        val: ClientReader | None = None,
        val_fraction: float | None = None,
        batch_size: int = 10,
        eval_batch_size: int = 512,
        seed: int = 0,
        num_workers: int = 0,
        shuffle: bool = True,
        drop_last: bool = False,
        dataloader_kwargs: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        if val is not None and val_fraction is not None:
            raise ValueError(
                f"Pass either val (the source's held-out split) or val_fraction (split one off each client), not both; "
                f"got val={type(val).__name__} and val_fraction={val_fraction!r}."
            )
        if len(train.client_ids) == 0:
            raise ValueError(f"{type(train).__name__} has no clients: the training split is empty.")
        self._set_client_loading(
            batch_size=batch_size, eval_batch_size=eval_batch_size, num_workers=num_workers, shuffle=shuffle,
            drop_last=drop_last, dataloader_kwargs=dataloader_kwargs,
        )  # fmt: skip
        self.seed = check_int("seed", seed, minimum=0)
        self.val_fraction = None if val_fraction is None else check_val_fraction(val_fraction)
        self.val: ClientReader | None = val
        self.train: ClientReader = train
        if self.val_fraction is not None:
            self.train = ClientFraction(train, self.val_fraction, self.seed, held=False)
            self.val = ClientFraction(train, self.val_fraction, self.seed, held=True)
        self.test = test
        # Cached: the federated loop asks every client's count once per fit (342,477 calls for StackOverflow).
        self._counts = self.train.num_samples
        self._num_clients = len(self._counts)
        self.test_by_client = check_bool("test_by_client", test_by_client)
        self._test_position = self._positions_in(test) if test is not None and test_by_client else None
        self._warned_no_validation = False

    @property
    def num_clients(self) -> int:
        """Number of clients: the training split's users."""
        return self._num_clients

    @property
    def client_ids(self) -> list[str]:
        """The source's id of each client, by client position."""
        return list(self.train.client_ids)

    def client_num_samples(self, cid: int) -> int:
        """Number of training samples of client ``cid`` (from the index; nothing is read)."""
        return int(self._counts[self._check_cid(cid)])

    def client_batches(
        self,
        cid: int,
        *,
        generator: torch.Generator,
        num_epochs: int | None = None,
        num_batches: int | None = None,
        batch_size: int | None = None,
    ) -> ClientBatches:
        """Client ``cid``'s local batches, read now; see :func:`~fl_lightning.data.client_batches`."""
        samples = ClientSamples(self.train, self._check_cid(cid))
        return self._client_batches(
            samples, np.arange(len(samples)), generator=generator, num_epochs=num_epochs, num_batches=num_batches, batch_size=batch_size
        )

    def holdout_dataloader(self, cid: int) -> DataLoader[Any]:
        """Client ``cid``'s own test samples, in order (empty for a client absent from the test split)."""
        self._check_cid(cid)
        if self._test_position is None:
            why = "no test split" if self.test is None else "test clients that are not its training clients"
            raise RuntimeError(f"{type(self).__name__} has {why}, so its clients have no held-out data of their own.")
        position = int(self._test_position[cid])
        dataset: Dataset[Any] = ClientSamples(self.test, position) if position >= 0 else _EMPTY
        return self._loader(dataset)

    def train_dataloader(self) -> DataLoader[Any]:
        """All clients' training samples end to end, for Lightning's fit loop to hold; the federated loop
        trains on :meth:`client_batches` instead (this loader reads nothing until iterated)."""
        return self._loader(PooledClients(self.train), batch_size=self.batch_size)

    def val_dataloader(self) -> DataLoader[Any] | list[Any]:
        """The server's validation data (``val`` or the ``val_fraction`` split); none, with a one-time warning, without."""
        if self.val is not None:
            return self._loader(PooledClients(self.val))
        if not self._warned_no_validation:
            self._warned_no_validation = True
            rank_zero_warn(
                f"{type(self).__name__} has no validation split, so the global model is not validated and no model "
                "selection (ModelCheckpoint/EarlyStopping monitor) can happen; the test split is never used in its "
                "place. Pass val_fraction=... (e.g. 0.1) to set part of each client's training samples aside."
            )
        return []

    def test_dataloader(self) -> DataLoader[Any]:
        """Every client's test samples, client by client, for ``trainer.test()``."""
        if self.test is None:
            raise RuntimeError(f"{type(self).__name__} has no test split; pass test=... to test the global model.")
        return self._loader(PooledClients(self.test))

    def _positions_in(self, other: ClientReader) -> np.ndarray:
        """For each training client, its position in ``other`` (``-1`` where ``other`` lacks it)."""
        where = {client: position for position, client in enumerate(other.client_ids)}
        return np.fromiter((where.get(c, -1) for c in self.train.client_ids), dtype=np.int64, count=self.num_clients)

    def _check_cid(self, cid: int) -> int:
        if not 0 <= cid < self._num_clients:
            raise IndexError(f"client id {cid} is outside [0, {self.num_clients}).")
        return cid

    def _loader(self, dataset: Dataset[Any], *, batch_size: int | None = None) -> DataLoader[Any]:
        # Never shuffled: the pooled datasets read one client at a time and rely on a sequential pass.
        return DataLoader(
            dataset,
            batch_size=batch_size or self.eval_batch_size,
            num_workers=self.num_workers,
            **self.dataloader_kwargs,
        )


class _Empty(Dataset[Any]):
    """No samples: the held-out data of a client the test split lacks."""

    def __getitem__(self, index: int) -> Any:
        raise IndexError(index)

    def __len__(self) -> int:
        return 0


_EMPTY = _Empty()
