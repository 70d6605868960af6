import math

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset, TensorDataset

from fl_lightning.data import ClientBatches, InMemoryDataset, client_batches

DATA = InMemoryDataset(inputs=torch.arange(50.0).unsqueeze(1) * 10, labels=torch.arange(50) % 7, num_classes=7)
INDICES = np.array([3, 8, 11, 20, 21, 22, 30, 41, 42, 49])


class PerSample(Dataset):
    """The same samples without ``tensors``, forcing the DataLoader path."""

    def __init__(self, source: InMemoryDataset) -> None:
        self.source = source

    def __getitem__(self, index: int):
        return self.source[index]

    def __len__(self) -> int:
        return len(self.source)


def reference(n_epochs_drawn: int, batch_size: int, seed: int) -> list[torch.Tensor]:
    """The documented semantics, written out: per epoch one randperm, cut in order."""
    generator = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(n_epochs_drawn):
        order = torch.randperm(len(INDICES), generator=generator)
        batches += [torch.as_tensor(INDICES)[order[i : i + batch_size]] for i in range(0, len(INDICES), batch_size)]
    return batches


def stream(**kwargs) -> ClientBatches:
    kwargs.setdefault("generator", torch.Generator().manual_seed(0))
    return client_batches(DATA, INDICES, **kwargs)


def test_epochs_follow_the_documented_semantics() -> None:
    batches = list(stream(batch_size=3, num_epochs=2))
    expected = reference(2, batch_size=3, seed=0)
    assert [len(y) for _, y in batches] == [3, 3, 3, 1] * 2
    for (x, y), indices in zip(batches, expected, strict=True):
        torch.testing.assert_close(x[:, 0], indices.float() * 10)
        torch.testing.assert_close(y, indices % 7)


def test_each_epoch_is_a_permutation_of_the_client_samples() -> None:
    batches = list(stream(batch_size=4, num_epochs=3))
    per_epoch = math.ceil(len(INDICES) / 4)
    epochs = [torch.cat([x[:, 0] for x, _ in batches[e * per_epoch : (e + 1) * per_epoch]]) for e in range(3)]
    for epoch in epochs:
        np.testing.assert_array_equal(np.sort(epoch.numpy() / 10).astype(int), INDICES)
    assert not torch.equal(epochs[0], epochs[1])


@pytest.mark.parametrize(("num_batches", "permutations"), [(5, 2), (3, 1), (6, 2), (7, 3), (1, 1)])
def test_num_batches_crosses_epochs_and_draws_only_needed_permutations(num_batches: int, permutations: int) -> None:
    generator = torch.Generator().manual_seed(0)
    batches = list(stream(batch_size=4, num_batches=num_batches, generator=generator))
    assert len(batches) == num_batches
    expected = reference(permutations, batch_size=4, seed=0)[:num_batches]
    for (_, y), indices in zip(batches, expected, strict=True):
        torch.testing.assert_close(y, indices % 7)
    # The generator advanced by exactly `permutations` draws.
    replay = torch.Generator().manual_seed(0)
    for _ in range(permutations):
        torch.randperm(len(INDICES), generator=replay)
    assert torch.equal(generator.get_state(), replay.get_state())


def test_len() -> None:
    assert len(stream(batch_size=3, num_epochs=2)) == 8
    assert len(stream(batch_size=3, num_batches=11)) == 11
    assert stream(batch_size=3, num_epochs=1).batches_per_epoch == 4
    assert list(stream(batch_size=3, num_epochs=0)) == [] == list(stream(batch_size=3, num_batches=0))


def test_permutations_are_drawn_lazily_and_iteration_consumes_the_generator() -> None:
    generator = torch.Generator().manual_seed(0)
    batches = stream(batch_size=3, num_batches=2, generator=generator)
    assert torch.equal(generator.get_state(), torch.Generator().manual_seed(0).get_state())
    first, second = list(batches), list(batches)
    assert not all(torch.equal(a[1], b[1]) for a, b in zip(first, second, strict=True))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_dataloader_path_matches_fast_path(num_workers: int) -> None:
    kwargs = {"batch_size": 3, "num_batches": 9}
    fast = list(client_batches(DATA, INDICES, generator=torch.Generator().manual_seed(4), **kwargs))
    slow_stream = client_batches(
        PerSample(DATA), INDICES, generator=torch.Generator().manual_seed(4), num_workers=num_workers, **kwargs
    )
    slow = list(slow_stream)
    assert len(slow) == len(fast) == len(slow_stream)
    for (fx, fy), (sx, sy) in zip(fast, slow, strict=True):
        assert isinstance(fx, torch.Tensor) and isinstance(sx, torch.Tensor)
        torch.testing.assert_close(fx, sx)
        torch.testing.assert_close(fy, sy)


def test_tensor_dataset_takes_the_fast_path() -> None:
    data = TensorDataset(torch.arange(10.0), torch.arange(10))
    x, y = next(iter(client_batches(data, [1, 2, 3], batch_size=3, num_epochs=1, generator=torch.Generator())))
    assert sorted(y.tolist()) == [1, 2, 3] and torch.equal(x, y.float())


def test_the_device_is_the_dataset_tensors_or_unknown_for_a_dataloader() -> None:
    """What the lean executor reads to skip moving batches already on the device."""
    kwargs = {"batch_size": 3, "num_epochs": 1, "generator": torch.Generator()}
    assert client_batches(DATA, INDICES, **kwargs).device == torch.device("cpu")
    assert client_batches(PerSample(DATA), INDICES, **kwargs).device is None  # the collate function decides


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_device_resident_data_is_gathered_on_the_device_in_the_same_order() -> None:
    on_gpu = InMemoryDataset(inputs=DATA.tensors[0].cuda(), labels=DATA.tensors[1].cuda(), num_classes=7)
    gpu = list(client_batches(on_gpu, INDICES, batch_size=3, num_epochs=2, generator=torch.Generator().manual_seed(0)))
    cpu = list(stream(batch_size=3, num_epochs=2))
    assert all(x.is_cuda and y.is_cuda for x, y in gpu)
    assert all(torch.equal(a.cpu(), b) for g, c in zip(gpu, cpu, strict=True) for a, b in zip(g, c))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"batch_size": 2}, r"exactly one of num_epochs and num_batches, got num_epochs=None, num_batches=None"),
        ({"batch_size": 2, "num_epochs": 1, "num_batches": 1}, r"exactly one of num_epochs and num_batches"),
        ({"batch_size": 0, "num_epochs": 1}, r"batch_size must be an int >= 1, got 0"),
        ({"batch_size": 2, "num_batches": -1}, r"num_batches must be an int >= 0, got -1"),
        ({"batch_size": 2, "num_epochs": 1.5}, r"num_epochs must be an int >= 0, got 1.5"),
    ],
)
def test_bad_arguments(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        stream(**kwargs)


def test_empty_client() -> None:
    with pytest.raises(ValueError, match=r"indices is empty; a client needs at least one sample"):
        client_batches(DATA, np.array([], dtype=np.int64), batch_size=2, num_batches=1, generator=torch.Generator())


def test_shuffle_false_serves_the_given_order_every_epoch_and_draws_nothing() -> None:
    unsorted = INDICES[::-1].copy()
    generator = torch.Generator().manual_seed(0)
    state = generator.get_state()
    batches = list(client_batches(DATA, unsorted, batch_size=4, num_batches=6, shuffle=False, generator=generator))
    served = (torch.cat([x[:, 0] for x, _ in batches]) / 10).long().tolist()
    assert served == np.concatenate([unsorted, unsorted]).tolist()
    assert [len(y) for _, y in batches] == [4, 4, 2, 4, 4, 2]
    assert torch.equal(generator.get_state(), state)


def test_drop_last_drops_each_epochs_partial_batch() -> None:
    batches = list(stream(batch_size=4, num_epochs=2, drop_last=True))
    assert [len(y) for _, y in batches] == [4, 4] * 2
    expected = reference(2, batch_size=4, seed=0)
    for (x, _), want in zip(batches, [expected[0], expected[1], expected[3], expected[4]], strict=True):
        torch.testing.assert_close(x[:, 0], want.float() * 10)


@pytest.mark.parametrize("kwargs", [dict(num_epochs=2), dict(num_batches=5)])
def test_drop_last_leaves_a_client_smaller_than_a_batch_without_batches(kwargs: dict) -> None:
    batches = stream(batch_size=11, drop_last=True, **kwargs)
    assert (len(batches), list(batches)) == (0, [])


class RowsTwice(torch.Tensor):
    """A tensor subclass whose own indexing differs from index_select's: the stream must keep it."""

    def __getitem__(self, index):
        return super().__getitem__(index) * 2


def test_a_tensor_subclass_keeps_its_own_indexing() -> None:
    labels = torch.arange(10)
    data = TensorDataset(torch.arange(10.0).as_subclass(RowsTwice), labels)
    for x, y in client_batches(data, list(range(10)), batch_size=4, num_epochs=1, generator=torch.Generator().manual_seed(0)):
        torch.testing.assert_close(x.as_subclass(torch.Tensor), 2 * y.float())
