import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset

from fl_lightning.data import (
    IID,
    Dirichlet,
    FederatedDataModule,
    FedProxSynthetic,
    InMemoryDataset,
    LabelsPerClient,
    Natural,
)

TRAIN = InMemoryDataset(inputs=torch.arange(200.0).unsqueeze(1), labels=torch.arange(200) % 5, num_classes=5)
TEST = InMemoryDataset(inputs=-torch.arange(30.0).unsqueeze(1), labels=torch.arange(30) % 5, num_classes=5)


def datamodule(**kwargs) -> FederatedDataModule:
    kwargs.setdefault("num_clients", 4)
    return FederatedDataModule(TRAIN, kwargs.pop("test", TEST), **kwargs)


def all_indices(dm: FederatedDataModule) -> list[np.ndarray]:
    return [dm.client_indices(cid) for cid in range(dm.num_clients)]


def test_partition_is_the_partitioner_applied_with_default_rng_seed() -> None:
    dm = datamodule(partitioner=Dirichlet(alpha=0.5), seed=3)
    dm.setup("fit")
    expected = Dirichlet(alpha=0.5)(TRAIN.targets, 200, 4, np.random.default_rng(3))
    for got, want in zip(all_indices(dm), expected, strict=True):
        np.testing.assert_array_equal(got, want)
    assert sum(dm.client_num_samples(cid) for cid in range(4)) == 200


def test_client_indices_are_read_only() -> None:
    dm = datamodule(holdout_fraction=0.2)
    with pytest.raises(ValueError, match="read-only"):
        dm.client_indices(0)[0] = 5


def test_setup_is_idempotent_and_implicit() -> None:
    dm = datamodule()
    first = all_indices(dm)  # no setup() call: partitions on first use
    dm.setup("fit")
    dm.setup("test")
    for a, b in zip(first, all_indices(dm), strict=True):
        np.testing.assert_array_equal(a, b)
    assert isinstance(dm.partitioner, IID)


def test_label_counts_and_num_classes() -> None:
    dm = datamodule(partitioner=LabelsPerClient(1), num_clients=5)
    counts = np.stack([dm.label_counts(cid) for cid in range(5)])
    assert counts.shape == (5, 5) and dm.num_classes == 5
    np.testing.assert_array_equal(np.sort(counts.max(axis=1)), [40] * 5)
    assert (np.count_nonzero(counts, axis=1) == 1).all()


def test_holdout_split() -> None:
    dm = datamodule(holdout_fraction=0.25, seed=1)
    full = IID()(None, 200, 4, np.random.default_rng(1))
    for cid, part in enumerate(full):
        train = dm.client_indices(cid)
        held = torch.cat([x[:, 0] for x, _ in dm.holdout_dataloader(cid)]).long().numpy()
        assert len(held) == 12 and len(train) == 38
        assert np.all(np.diff(held) > 0)
        np.testing.assert_array_equal(np.sort(np.concatenate([train, held])), part)
    again = datamodule(holdout_fraction=0.25, seed=1)
    np.testing.assert_array_equal(again.client_indices(2), dm.client_indices(2))


def test_holdout_keeps_at_least_one_training_sample() -> None:
    dm = datamodule(holdout_fraction=0.9, num_clients=100)
    assert {dm.client_num_samples(cid) for cid in range(100)} == {1}


def test_holdout_dataloader_without_holdout() -> None:
    with pytest.raises(RuntimeError, match=r"no held-out data: set holdout_fraction > 0"):
        datamodule().holdout_dataloader(0)


def test_client_batches_use_the_client_data_and_batch_size() -> None:
    dm = datamodule(batch_size=7)
    batches = dm.client_batches(1, num_epochs=1, generator=torch.Generator().manual_seed(0))
    assert len(batches) == 8
    seen = torch.cat([x[:, 0] for x, _ in batches]).long().numpy()
    np.testing.assert_array_equal(np.sort(seen), dm.client_indices(1))


def test_partition_file_is_written_then_read(tmp_path: Path) -> None:
    path = tmp_path / "splits" / "partition.json"
    written = datamodule(partitioner=Dirichlet(alpha=0.3), partition_file=str(path))
    written.setup("fit")
    payload = json.loads(path.read_text())
    assert payload["num_clients"] == 4 and len(payload["clients"]) == 4
    # The file wins over the partitioner and seed of a later run.
    read = datamodule(partitioner=IID(), seed=99, partition_file=str(path))
    for a, b in zip(all_indices(written), all_indices(read), strict=True):
        np.testing.assert_array_equal(a, b)


def test_save_and_load_partition_round_trip(tmp_path: Path) -> None:
    source = datamodule(partitioner=LabelsPerClient(2), holdout_fraction=0.1)
    source.save_partition(tmp_path / "p.json")
    target = datamodule(holdout_fraction=0.1)
    target.load_partition(tmp_path / "p.json")
    for a, b in zip(all_indices(source), all_indices(target), strict=True):
        np.testing.assert_array_equal(a, b)
        assert a.dtype == np.int64
    # The file stores the partition before the held-out split.
    saved = json.loads((tmp_path / "p.json").read_text())["clients"]
    assert sum(map(len, saved)) == 200


@pytest.mark.parametrize(
    ("payload", "match"),
    [
        ({"num_clients": 3, "clients": [[0], [1], [2]]}, r"has 3 clients but num_clients=4"),
        ({"num_clients": 4, "clients": [[0], [1], [2]]}, r"declares num_clients=4 but lists 3 clients"),
        ({"num_clients": 4, "clients": [[0], [1], [2], [200]]}, r"client 3 has index 200 outside \[0, 200\)"),
        ({"num_clients": 4, "clients": [[0], [1], [2], [-1]]}, r"client 3 has index -1 outside \[0, 200\)"),
        ({"num_clients": 4, "clients": [[0, 1], [1], [2], [3]]}, r"index 1 is assigned to more than one client"),
        ({"num_clients": 4, "clients": [[0], [], [2], [3]]}, r"left client 1 empty"),
        ({"clients": [[0], [1], [2], [3]]}, r"is not a partition: expected JSON"),
    ],
)
def test_bad_partition_file(tmp_path: Path, payload: dict, match: str) -> None:
    path = tmp_path / "p.json"
    path.write_text(json.dumps(payload))
    with pytest.raises(ValueError, match=match):
        datamodule(partition_file=str(path)).setup("fit")


def test_natural_partition_uses_client_ids() -> None:
    train = FedProxSynthetic(num_clients=6, samples_per_client=20)
    dm = FederatedDataModule(train, partitioner=Natural(), num_clients=6)
    for cid in range(6):
        np.testing.assert_array_equal(dm.client_indices(cid), np.flatnonzero(train.client_ids == cid))


def test_natural_without_client_ids() -> None:
    with pytest.raises(ValueError, match=r"Natural\(\) needs train.client_ids, which InMemoryDataset lacks"):
        datamodule(partitioner=Natural()).setup("fit")


VAL = InMemoryDataset(inputs=1000 + torch.arange(20.0).unsqueeze(1), labels=torch.arange(20) % 5, num_classes=5)


def first_feature(loader) -> list[float]:
    return torch.cat([x[:, 0] for x, _ in loader]).tolist()


def test_dataloaders() -> None:
    dm = datamodule(val=VAL, eval_batch_size=8, batch_size=16)
    train_seen = torch.cat([x[:, 0] for x, _ in dm.train_dataloader()])
    assert sorted(train_seen.long().tolist()) == list(range(200))
    assert dm.val_dataloader().batch_size == dm.test_dataloader().batch_size == 8
    assert first_feature(dm.val_dataloader()) == [1000.0 + i for i in range(20)]
    assert first_feature(dm.test_dataloader()) == [-float(i) for i in range(30)]


def test_without_validation_set_nothing_is_validated_and_a_warning_says_so() -> None:
    dm = datamodule()  # a test set, but no val / val_fraction: the test set must not stand in
    with pytest.warns(UserWarning, match=r"no validation set.*never used in its place.*val_fraction"):
        assert dm.val_dataloader() == []
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # one-time: a second request is silent
        assert dm.val_dataloader() == []


def test_dataloaders_without_test_set() -> None:
    dm = datamodule(test=None, val=VAL)
    assert first_feature(dm.val_dataloader())[:2] == [1000.0, 1001.0]
    with pytest.raises(RuntimeError, match=r"no test set; pass test="):
        dm.test_dataloader()


def test_val_fraction_is_split_off_before_partitioning() -> None:
    dm = datamodule(val_fraction=0.1, seed=4, partitioner=Dirichlet(alpha=0.5), holdout_fraction=0.2)
    val = dm.validation_indices
    assert len(val) == 20 and np.all(np.diff(val) > 0)
    assert first_feature(dm.val_dataloader()) == val.astype(float).tolist()
    # No client trains on (or holds out) a validation sample; together they cover the training set.
    held = [np.asarray(first_feature(dm.holdout_dataloader(c)), dtype=np.int64) for c in range(4)]  # feature = index
    client_data = [dm.client_indices(c) for c in range(4)] + held
    for indices in client_data:
        assert np.intersect1d(indices, val).size == 0
    np.testing.assert_array_equal(np.sort(np.concatenate([val, *client_data])), np.arange(200))
    # The partitioner sees only the remaining pool, with its labels.
    pool = np.setdiff1d(np.arange(200), val)
    expected = Dirichlet(alpha=0.5)(np.asarray(TRAIN.targets)[pool], 180, 4, np.random.default_rng(4))
    for cid, part in enumerate(expected):
        np.testing.assert_array_equal(np.sort(np.concatenate([dm.client_indices(cid), held[cid]])), pool[part])


def test_val_fraction_split_is_deterministic_from_the_seed() -> None:
    first = datamodule(val_fraction=0.25, seed=7).validation_indices
    np.testing.assert_array_equal(datamodule(val_fraction=0.25, seed=7).validation_indices, first)
    assert not np.array_equal(datamodule(val_fraction=0.25, seed=8).validation_indices, first)
    assert datamodule().validation_indices.size == 0


def test_partition_file_that_leaks_validation_samples_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "partition.json"
    datamodule(partition_file=str(path)).setup()  # written without a validation split
    with pytest.raises(ValueError, match=r"gives \d+ validation samples .* val_fraction=0.1 reserves them"):
        datamodule(val_fraction=0.1, partition_file=str(path)).setup()


def test_from_datamodule_keeps_the_users_validation_and_test_sets() -> None:
    from lightning.pytorch import LightningDataModule
    from torch.utils.data import DataLoader

    class Plain(LightningDataModule):
        def train_dataloader(self):
            return DataLoader(TRAIN, batch_size=7)

        def val_dataloader(self):
            return DataLoader(VAL)

        def test_dataloader(self):
            return DataLoader(TEST)

    dm = FederatedDataModule.from_datamodule(Plain(), num_clients=4)
    assert (dm.train, dm.val, dm.test, dm.batch_size) == (TRAIN, VAL, TEST, 7)


def test_client_id_out_of_range() -> None:
    with pytest.raises(IndexError, match=r"client id 4 is outside \[0, 4\)"):
        datamodule().client_indices(4)


def test_label_counts_without_targets() -> None:
    class Unlabelled(Dataset):
        def __getitem__(self, index: int):
            return torch.zeros(1), 0

        def __len__(self) -> int:
            return 10

    with pytest.raises(ValueError, match=r"label_counts needs train.targets; Unlabelled has none"):
        FederatedDataModule(Unlabelled(), num_clients=2).label_counts(0)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_clients": 0}, r"num_clients must be an int >= 1, got 0"),
        ({"num_clients": 201}, r"num_clients=201 exceeds the 200 training samples"),
        ({"batch_size": 0}, r"batch_size must be an int >= 1, got 0"),
        ({"eval_batch_size": -3}, r"eval_batch_size must be an int >= 1, got -3"),
        ({"holdout_fraction": 1.0}, r"holdout_fraction must be in \[0, 1\), got 1.0"),
        ({"holdout_fraction": -0.1}, r"holdout_fraction must be in \[0, 1\), got -0.1"),
        ({"num_workers": -1}, r"num_workers must be an int >= 0, got -1"),
        ({"val_fraction": 0.0}, r"val_fraction must be a float in \(0, 1\) \(exclusive\), got 0.0"),
        ({"val_fraction": 1}, r"val_fraction must be a float in \(0, 1\) \(exclusive\), got 1"),
        ({"val_fraction": "0.1"}, r"val_fraction must be a float in \(0, 1\) \(exclusive\), got '0.1'"),
        ({"val_fraction": 0.1, "val": TEST}, r"either val .* or val_fraction .*, not both"),
        ({"val_fraction": 0.99, "num_clients": 3}, r"num_clients=3 exceeds the 2 training samples left to the clients"),
    ],
)
def test_bad_arguments(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        datamodule(**kwargs)


def test_lightning_trainer_accepts_the_datamodule(tmp_path: Path) -> None:
    from lightning.pytorch import LightningModule, Trainer

    class Tiny(LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(1, 5)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.cross_entropy(self.layer(x), y)

        def validation_step(self, batch, batch_idx):
            x, y = batch
            self.log("val_loss", torch.nn.functional.cross_entropy(self.layer(x), y))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    trainer = Trainer(
        default_root_dir=tmp_path,
        max_steps=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
    )
    trainer.fit(Tiny(), datamodule=datamodule(val=VAL))
    assert trainer.global_step == 2


def served_order(dm: FederatedDataModule, cid: int, *, epochs: int = 2) -> list[int]:
    """The training-set indices client ``cid`` is served, in order, over ``epochs`` local epochs."""
    batches = dm.client_batches(cid, num_epochs=epochs, generator=torch.Generator().manual_seed(0), batch_size=3)
    return torch.cat([x[:, 0] for x, _ in batches]).long().tolist()


def write_unsorted_partition(path: Path) -> list[list[int]]:
    """Writes a 4-client partition of ``TRAIN`` whose clients list their indices unsorted."""
    clients = [[int(i) for i in np.random.default_rng(c).permutation(np.arange(c * 50, (c + 1) * 50))] for c in range(4)]
    path.write_text(json.dumps({"num_clients": 4, "clients": clients}))
    return clients


def test_shuffle_false_keeps_a_partition_files_order_every_epoch(tmp_path: Path) -> None:
    path = tmp_path / "partition.json"
    stored = write_unsorted_partition(path)
    dm = datamodule(shuffle=False, partition_file=str(path))
    assert [dm.client_indices(cid).tolist() for cid in range(4)] == stored
    assert served_order(dm, 2) == stored[2] * 2
    # A save/load round trip keeps the order too.
    dm.save_partition(tmp_path / "again.json")
    again = datamodule(shuffle=False, partition_file=str(tmp_path / "again.json"))
    assert [served_order(again, cid) for cid in range(4)] == [order * 2 for order in stored]


def test_default_shuffle_loads_sorted_and_reshuffles_every_epoch(tmp_path: Path) -> None:
    path = tmp_path / "partition.json"
    stored = write_unsorted_partition(path)
    dm = datamodule(partition_file=str(path))
    assert dm.client_indices(1).tolist() == sorted(stored[1])
    served = served_order(dm, 1)
    generator = torch.Generator().manual_seed(0)
    expected = [sorted(stored[1])[i] for _ in range(2) for i in torch.randperm(50, generator=generator).tolist()]
    assert served == expected


def test_shuffle_false_with_a_partitioner_serves_sorted_indices() -> None:
    dm = datamodule(shuffle=False, partitioner=Dirichlet(alpha=0.5))
    assert served_order(dm, 0, epochs=1) == sorted(dm.client_indices(0).tolist())


def test_held_out_samples_do_not_depend_on_the_stored_order(tmp_path: Path) -> None:
    path = tmp_path / "partition.json"
    stored = write_unsorted_partition(path)
    ordered = datamodule(shuffle=False, partition_file=str(path), holdout_fraction=0.2)
    shuffled = datamodule(partition_file=str(path), holdout_fraction=0.2)
    for cid in range(4):
        held = [x for x, _ in ordered.holdout_dataloader(cid)]
        torch.testing.assert_close(held, [x for x, _ in shuffled.holdout_dataloader(cid)])
        held_set = set(torch.cat(held)[:, 0].long().tolist())
        assert ordered.client_indices(cid).tolist() == [i for i in stored[cid] if i not in held_set]


def test_val_fraction_that_empties_a_natural_client_is_rejected_by_name() -> None:
    train = FedProxSynthetic(num_clients=20, split="train", samples_per_client=[2] * 19 + [400])  # 19 one-sample clients
    dm = FederatedDataModule(train, val_fraction=0.3, partitioner=Natural(), num_clients=20, seed=0)
    with pytest.raises(ValueError, match=r"val_fraction=0.3 took every training sample of \d+ of the dataset's own clients"):
        dm.setup()
