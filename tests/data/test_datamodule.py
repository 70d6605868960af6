import json
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


def test_dataloaders() -> None:
    dm = datamodule(eval_batch_size=8, batch_size=16)
    train_seen = torch.cat([x[:, 0] for x, _ in dm.train_dataloader()])
    assert sorted(train_seen.long().tolist()) == list(range(200))
    for loader in (dm.val_dataloader(), dm.test_dataloader()):
        assert loader.batch_size == 8
        assert torch.cat([x[:, 0] for x, _ in loader]).tolist() == [-float(i) for i in range(30)]


def test_dataloaders_without_test_set() -> None:
    dm = datamodule(test=None)
    assert dm.val_dataloader() == []  # federated training runs without server evaluation
    with pytest.raises(RuntimeError, match=r"no test set; pass test="):
        dm.test_dataloader()


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
    trainer.fit(Tiny(), datamodule=datamodule())
    assert trainer.global_step == 2
