"""``Federated``: any ``LightningDataModule`` federated, written as a YAML ``data:`` block."""

from __future__ import annotations

from lightning.pytorch import LightningDataModule

from fl_lightning import _lightning_compat as compat
from fl_lightning.data.datamodule import FederatedDataModule, datamodule_arguments
from fl_lightning.data.partitioners import Partitioner

# In a config, the datamodule nested in ``Federated`` keeps its own hparams, under any LightningCLI.
compat.give_cli_hparams_only_to_configured_classes()


class Federated(FederatedDataModule):
    """A ``LightningDataModule`` partitioned among clients: ``FederatedDataModule.from_datamodule``
    as a class, so that a config can name it by ``class_path``::

        data:
          class_path: fl_lightning.data.Federated
          init_args:
            datamodule:
              class_path: my_project.MyDataModule
              init_args: {data_dir: data, batch_size: 32}
            partitioner:
              class_path: fl_lightning.data.Dirichlet
              init_args: {alpha: 0.5}
            num_clients: 20

    The clients' batches follow the datamodule's ``train_dataloader`` (batch size, ``shuffle``,
    ``drop_last``, ``collate_fn``, workers, ...), its ``val_dataloader`` is the server's validation
    set and its ``test_dataloader`` the test set, as in
    :meth:`~fl_lightning.data.FederatedDataModule.from_datamodule`. An argument left ``None`` is
    taken from the datamodule's loaders; the others are :class:`FederatedDataModule`'s. The
    datamodule's batch-transfer hooks run on every batch.

    Args:
        datamodule: The datamodule to federate.
        partitioner: How to split its training set; :class:`~fl_lightning.data.IID` by default.
        num_clients: Number of clients.
        seed: Seed of the validation split, the partition and the held-out split.
        val_fraction: Fraction of the training set split off as the validation set, for a
            datamodule without ``val_dataloader``.
        holdout_fraction: Fraction of each client's samples held out, in ``[0, 1)``.
        partition_file: JSON file to load the partition from, or to save it to.
        batch_size: Clients' local batch size (default: the training loader's).
        eval_batch_size: Batch size of the evaluation loaders (default: the validation loader's, else 512).
        shuffle: Reshuffle every local epoch (default: whether the training loader shuffles).
        drop_last: Drop each client's last partial batch (default: the training loader's).
        num_workers: DataLoader workers (default: the training loader's).
    """

    def __init__(
        self,
        datamodule: LightningDataModule,
        *,
        partitioner: Partitioner | None = None,
        num_clients: int = 10,
        seed: int = 0,
        val_fraction: float | None = None,
        holdout_fraction: float = 0.0,
        partition_file: str | None = None,
        batch_size: int | None = None,
        eval_batch_size: int | None = None,
        shuffle: bool | None = None,
        drop_last: bool | None = None,
        num_workers: int | None = None,
    ) -> None:
        overrides = {
            "batch_size": batch_size,
            "eval_batch_size": eval_batch_size,
            "shuffle": shuffle,
            "drop_last": drop_last,
            "num_workers": num_workers,
        }
        arguments = datamodule_arguments(datamodule)
        if val_fraction is not None and "val" in arguments:
            raise ValueError(
                f"{type(datamodule).__name__} has a val_dataloader, which is the server's validation set; "
                f"val_fraction={val_fraction!r} would split a second one off the training set: remove val_fraction."
            )
        arguments.update({name: value for name, value in overrides.items() if value is not None})
        super().__init__(
            **arguments,
            partitioner=partitioner,
            num_clients=num_clients,
            seed=seed,
            val_fraction=val_fraction,
            holdout_fraction=holdout_fraction,
            partition_file=partition_file,
        )
        self.adopt(datamodule)
