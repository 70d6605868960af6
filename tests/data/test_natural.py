"""NaturalDataModule: lazy clients (an untouched client is never read), FederatedDataModule's batches
sample for sample, the three splits, per-client held-out data, and clear errors."""

from __future__ import annotations


import numpy as np
import pytest
import torch
from torch.utils.data import TensorDataset

from fl_lightning import FederatedEvaluation, FederatedTrainer, LocalOnly
from fl_lightning.data import FederatedDataModule, Natural
from fl_lightning.data.client_reader import IndexedReader
from fl_lightning.data.natural import NaturalDataModule
from fl_lightning.models import MLP

from ..integration.conftest import QUIET

SIZES = {"u03": 5, "u00": 7, "u01": 1, "u04": 12, "u02": 9, "u05": 4}


class CountingReader(IndexedReader):
    """Clients ``SIZES`` (sorted by id) of 4-feature samples; counts every client read."""

    def __init__(self, sizes: dict[str, int], offset: float = 0.0) -> None:
        self._ids = sorted(sizes)
        self._counts = np.array([sizes[c] for c in self._ids], dtype=np.int64)
        self.offset = offset
        self.reads: list[str] = []

    def samples(self, position: int) -> tuple[torch.Tensor, torch.Tensor]:
        n = int(self._counts[position])
        x = torch.arange(4 * n, dtype=torch.float32).reshape(n, 4) + 100 * position + self.offset
        return x, torch.arange(n) % 3

    def read(self, position: int) -> tuple[torch.Tensor, ...]:
        self.reads.append(self._ids[position])
        return self.samples(position)


def test_construction_reads_nothing_and_counts_come_from_the_index() -> None:
    reader = CountingReader(SIZES)
    data = NaturalDataModule(reader, CountingReader({"u00": 2, "u04": 3}))
    assert data.num_clients == 6 and data.client_ids == sorted(SIZES)
    assert [data.client_num_samples(c) for c in range(6)] == [SIZES[c] for c in sorted(SIZES)]
    assert reader.reads == []


def test_a_round_reads_only_the_clients_that_train() -> None:
    reader = CountingReader(SIZES)
    data = NaturalDataModule(reader, batch_size=4)
    trainer = FederatedTrainer(**QUIET, max_epochs=1, clients_per_round=2, local_steps=2)
    with pytest.warns(UserWarning, match="no validation split"):
        trainer.fit(MLP(in_features=4, hidden=(8,), num_classes=3, lr=0.1), datamodule=data)
    assert len(reader.reads) == 2 and len(set(reader.reads)) == 2  # each trained client read once, the 4 others never


def test_batches_equal_federated_datamodule_with_the_natural_partition() -> None:
    """The same samples, the same seed: every client's batch stream is FederatedDataModule's, sample for sample."""
    reader = CountingReader(SIZES)
    natural = NaturalDataModule(reader, batch_size=3)
    x, y, owner = [], [], []
    for position in range(len(SIZES)):
        xs, ys = reader.samples(position)
        x.append(xs), y.append(ys), owner.extend([position] * len(ys))
    pooled = TensorDataset(torch.cat(x), torch.cat(y))
    pooled.client_ids = np.array(owner)  # type: ignore[attr-defined]
    reference = FederatedDataModule(pooled, partitioner=Natural(), num_clients=len(SIZES), batch_size=3)
    for cid in range(len(SIZES)):
        assert natural.client_num_samples(cid) == reference.client_num_samples(cid)
        ours = list(natural.client_batches(cid, generator=torch.Generator().manual_seed(cid), num_batches=5))
        theirs = list(reference.client_batches(cid, generator=torch.Generator().manual_seed(cid), num_batches=5))
        assert len(ours) == len(theirs) == 5
        for (xa, ya), (xb, yb) in zip(ours, theirs):
            assert torch.equal(xa, xb) and torch.equal(ya, yb)


def test_val_fraction_sets_each_clients_samples_aside_disjointly() -> None:
    reader = CountingReader(SIZES)
    data = NaturalDataModule(reader, val_fraction=0.25, seed=3)
    val_rows = torch.cat([x for x, _ in data.val_dataloader()])
    for cid, client in enumerate(data.client_ids):
        n = SIZES[client]
        held = 0 if n == 1 else min(n - 1, max(1, round(0.25 * n)))
        assert data.client_num_samples(cid) == n - held
        (train_x, _), = data.client_batches(cid, generator=torch.Generator(), num_epochs=1, batch_size=100)
        mine = val_rows[(val_rows >= 100 * cid) & (val_rows < 100 * cid + 100)].reshape(-1, 4)
        assert len(mine) == held
        together = torch.cat([train_x, mine])[:, 0].sort().values
        assert torch.equal(together, reader.samples(cid)[0][:, 0])  # kept + held = the client's samples, no overlap
    again = NaturalDataModule(CountingReader(SIZES), val_fraction=0.25, seed=3)
    assert torch.equal(torch.cat([x for x, _ in again.val_dataloader()]), val_rows)  # drawn from the seed alone


def test_held_out_data_is_the_clients_own_test_split_and_test_pools_it() -> None:
    test = CountingReader({"u00": 2, "u04": 3, "zz": 1}, offset=0.5)
    data = NaturalDataModule(CountingReader(SIZES), test)
    (x0, _), = data.holdout_dataloader(0)
    assert torch.equal(x0, test.samples(0)[0])  # u00 is the test split's client 0
    (x4, _), = data.holdout_dataloader(4)
    assert torch.equal(x4, test.samples(1)[0])
    assert list(data.holdout_dataloader(2)) == []  # u02 has no test samples
    pooled = torch.cat([x for x, _ in data.test_dataloader()])
    assert torch.equal(pooled, torch.cat([test.samples(p)[0] for p in range(3)]))


def test_federated_evaluation_scores_each_client_on_its_test_split() -> None:
    test = CountingReader({c: 2 for c in SIZES}, offset=0.5)
    data = NaturalDataModule(CountingReader(SIZES), test, val_fraction=0.2)
    evaluation = FederatedEvaluation()
    trainer = FederatedTrainer(**QUIET, max_epochs=1, clients_per_round=2, local_steps=1, callbacks=[evaluation])
    trainer.fit(MLP(in_features=4, hidden=(8,), num_classes=3, lr=0.1), datamodule=data)
    assert sorted(e.client_id for e in evaluation.last_results) == list(range(6))
    assert all(e.num_samples == 2 for e in evaluation.last_results)


def test_errors_name_the_value() -> None:
    reader = CountingReader(SIZES)
    with pytest.raises(ValueError, match="either val .* or val_fraction"):
        NaturalDataModule(reader, val=reader, val_fraction=0.1)
    with pytest.raises(ValueError, match=r"val_fraction must be a float in \(0, 1\)"):
        NaturalDataModule(reader, val_fraction=1.5)
    with pytest.raises(ValueError, match="no clients"):
        NaturalDataModule(CountingReader({}))
    with pytest.raises(IndexError, match=r"client id 6 is outside \[0, 6\)"):
        NaturalDataModule(reader).client_num_samples(6)


def test_a_client_whose_file_disagrees_with_its_index_is_refused() -> None:
    class Short(CountingReader):
        def read(self, position: int) -> tuple[torch.Tensor, ...]:
            x, y = self.samples(position)
            return x[:-1], y[:-1]

    data = NaturalDataModule(Short(SIZES))
    with pytest.raises(ValueError, match=r"client 'u00' has \[6\] samples, but its index says 7"):
        data.client_batches(0, generator=torch.Generator(), num_epochs=1)


def test_resume_is_bit_exact(tmp_path) -> None:
    """Clients read lazily resume as any other data: 3 rounds in one go equal 2 rounds, then a resumed third."""

    def fit(rounds: int, root: str, ckpt_path: str | None = None) -> tuple[torch.Tensor, FederatedTrainer]:
        torch.manual_seed(0)
        model = MLP(in_features=4, hidden=(8,), num_classes=3, lr=0.1)
        options = {**QUIET, "enable_checkpointing": True, "default_root_dir": str(tmp_path / root)}
        trainer = FederatedTrainer(**options, max_epochs=rounds, clients_per_round=2, local_steps=2)
        trainer.fit(model, datamodule=NaturalDataModule(CountingReader(SIZES), val_fraction=0.2), ckpt_path=ckpt_path)
        return torch.cat([p.detach().flatten() for p in model.parameters()]), trainer

    uninterrupted, _ = fit(3, "once")
    fit(2, "twice")
    resumed, trainer = fit(3, "twice", ckpt_path="last")
    assert str(trainer.ckpt_path).endswith(".ckpt")  # really resumed, not retrained from scratch
    assert torch.equal(resumed, uninterrupted)


def test_local_only_scores_each_client_on_its_natural_test_split() -> None:
    # LocalOnly once read "no holdout_fraction" as "no held-out data" and refused natural federations.
    test = CountingReader({c: 2 for c in SIZES}, offset=0.5)
    data = NaturalDataModule(CountingReader(SIZES), test, val_fraction=0.2)
    trainer = FederatedTrainer(**QUIET, max_epochs=1, local_steps=1, algorithm=LocalOnly(clients=[0, 1]))
    trainer.fit(MLP(in_features=4, hidden=(8,), num_classes=3, lr=0.1), datamodule=data)
    assert 0.0 <= trainer.callback_metrics["round/local_test_acc"] <= 1.0
