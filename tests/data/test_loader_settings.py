from pathlib import Path
from typing import Any

import pytest
import torch
from lightning.pytorch import LightningDataModule
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, SequentialSampler

from fl_lightning import FederatedTrainer
from fl_lightning.data import FederatedDataModule, client_batches
from tests.data.user_project import UserDataModule, UserModule, dict_collate
from tests.quiet import QUIET



class WithLoader(LightningDataModule):
    """A datamodule whose training loader is ``DataLoader(data, **loader)``."""

    def __init__(self, **loader: Any) -> None:
        super().__init__()
        self.data = UserDataModule().data
        self.loader = loader

    def train_dataloader(self) -> DataLoader[Any]:
        return DataLoader(self.data, **self.loader)


def test_from_datamodule_carries_the_loader_settings_over() -> None:
    def init(worker_id: int) -> None: ...

    dm = FederatedDataModule.from_datamodule(
        WithLoader(batch_size=3, drop_last=True, collate_fn=dict_collate, num_workers=1, worker_init_fn=init,
                   persistent_workers=True, timeout=5.0),
        num_clients=2,
    )
    assert (dm.batch_size, dm.shuffle, dm.drop_last, dm.num_workers) == (3, False, True, 1)
    assert dm.dataloader_kwargs == {"collate_fn": dict_collate, "worker_init_fn": init, "persistent_workers": True, "timeout": 5.0}
    loader = dm.train_dataloader()
    assert (loader.collate_fn, loader.worker_init_fn, loader.persistent_workers, loader.drop_last) == (dict_collate, init, True, True)


def test_keyword_arguments_override_the_loader_settings() -> None:
    dm = FederatedDataModule.from_datamodule(WithLoader(batch_size=3, shuffle=True), num_clients=2, batch_size=5, shuffle=False)
    assert (dm.batch_size, dm.shuffle, dm.dataloader_kwargs) == (5, False, {})


def test_a_user_datamodule_with_dict_collate_and_drop_last_trains_federated(tmp_path: Path) -> None:
    # 40 samples over 4 clients: 10 each, in batches of 4 with the partial batch of 2 dropped.
    dm = FederatedDataModule.from_datamodule(UserDataModule(), num_clients=4)
    model = UserModule()
    trainer = FederatedTrainer(max_epochs=1, default_root_dir=tmp_path, **QUIET)
    trainer.fit(model, datamodule=dm)
    assert model.trained == [4, 4] * 4
    assert model.hooked == [True] * 8  # the datamodule's on_after_batch_transfer ran, with its trainer
    assert dm.eval_batch_size == 4
    assert model.validated == [4] * 10  # the user's validation set and batch size, through its collate_fn
    assert trainer.fit_loop.history[0] == [0, 1, 2, 3]


class Ordered(SequentialSampler):
    """A user's own sampler."""


@pytest.mark.parametrize(
    ("loader", "match"),
    [
        (dict(sampler=Ordered(range(40)), batch_size=2), r"has sampler Ordered, which cannot be honoured"),
        (dict(sampler=RandomSampler(range(40), replacement=True)), "has sampler RandomSampler with replacement"),
        (dict(sampler=RandomSampler(range(40), num_samples=8)), "has sampler RandomSampler with replacement or num_samples"),
        (dict(batch_sampler=BatchSampler(SequentialSampler(range(40)), 2, False)), r"has batch_sampler BatchSampler \(custom\)"),
        (dict(batch_size=None), r"has batch_sampler none \(batch_size=None\), which cannot be honoured"),
    ],
)
def test_settings_the_federated_loop_cannot_honour_are_refused(loader: dict, match: str) -> None:
    with pytest.raises(ValueError, match=r"^WithLoader.train_dataloader\(\) " + match):
        FederatedDataModule.from_datamodule(WithLoader(**loader), num_clients=2)


def test_unknown_dataloader_kwargs_are_refused() -> None:
    with pytest.raises(ValueError, match=r"dataloader_kwargs got \['sampler'\]; allowed keys are \['collate_fn'"):
        FederatedDataModule(UserDataModule().data, num_clients=2, dataloader_kwargs={"sampler": None})


def test_collate_fn_applies_to_tensor_datasets_too() -> None:
    batches = client_batches(UserDataModule().data, [0, 1, 2], batch_size=2, num_epochs=1,
                             generator=torch.Generator().manual_seed(0), dataloader_kwargs={"collate_fn": dict_collate})
    assert [sorted(batch) for batch in batches] == [["x", "y"], ["x", "y"]]
