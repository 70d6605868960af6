"""The torchvision wrappers, against fake torchvision classes: no network, no files."""

from typing import Any

import numpy as np
import pytest
import torch
import torchvision.datasets

from fl_lightning.data import CIFAR10, CIFAR100, EMNIST, MNIST, SVHN, FashionMNIST
from fl_lightning.data.datasets.vision import TorchvisionDataset, materialise

# (wrapper, constructor kwargs, raw layout, expected kwargs passed to torchvision)
CASES = [
    (MNIST, {"train": False}, "NHW", {"train": False}),
    (FashionMNIST, {}, "NHW", {"train": True}),
    (EMNIST, {"split_name": "balanced"}, "NHW", {"split": "balanced", "train": True}),
    (CIFAR10, {}, "NHWC", {"train": True}),
    (CIFAR100, {}, "NHWC", {"train": True}),
    (SVHN, {"split": "extra"}, "NCHW", {"split": "extra"}),
]
SIZE = {"NHW": (6, 5, 4), "NHWC": (6, 5, 4, 3), "NCHW": (6, 3, 5, 4)}


def fake_torchvision(layout: str, calls: list[dict[str, Any]]) -> type:
    """A torchvision-style class storing raw uint8 ``data`` the way the real one does."""

    class Fake:
        def __init__(self, **kwargs: Any) -> None:
            calls.append(kwargs)
            data = np.arange(np.prod(SIZE[layout]), dtype=np.int64).reshape(SIZE[layout]) % 256
            labels = np.array([1, 2, 3, 4, 5, 6])
            if layout == "NHW":  # MNIST-family keeps torch tensors
                self.data, self.targets = torch.as_tensor(data, dtype=torch.uint8), torch.as_tensor(labels)
            elif layout == "NHWC":  # CIFAR keeps a NumPy array and a list
                self.data, self.targets = data.astype(np.uint8), labels.tolist()
            else:  # SVHN keeps NumPy arrays under ``labels``
                self.data, self.labels = data.astype(np.uint8), labels

    return Fake


def expected_inputs(wrapper: type[TorchvisionDataset], layout: str) -> torch.Tensor:
    raw = torch.arange(int(np.prod(SIZE[layout]))).reshape(SIZE[layout]) % 256
    if layout == "NHW":
        raw = raw.unsqueeze(1)
    elif layout == "NHWC":
        raw = raw.permute(0, 3, 1, 2)
    mean = torch.tensor(wrapper.mean).view(1, -1, 1, 1)
    std = torch.tensor(wrapper.std).view(1, -1, 1, 1)
    return ((raw / 255.0 - mean) / std).float()


@pytest.mark.parametrize(
    ("wrapper", "kwargs", "layout", "forwarded"), CASES, ids=lambda c: getattr(c, "__name__", None)
)
def test_wrapper_materialises_normalised_channel_first_tensors(
    monkeypatch: pytest.MonkeyPatch, wrapper: type, kwargs: dict, layout: str, forwarded: dict
) -> None:
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(torchvision.datasets, wrapper.source_name, fake_torchvision(layout, calls))
    data = wrapper(root="somewhere", **kwargs)
    assert calls == [{"root": "somewhere", "download": False, **forwarded}]
    x, y = data.tensors
    expected = expected_inputs(wrapper, layout)
    if wrapper is EMNIST:
        expected = expected.transpose(-1, -2)
    assert x.dtype == torch.float32 and x.is_contiguous()
    torch.testing.assert_close(x, expected)
    assert y.dtype == torch.int64
    np.testing.assert_array_equal(data.targets, [1, 2, 3, 4, 5, 6])
    assert data.num_classes == {EMNIST: 47, CIFAR100: 100}.get(wrapper, 10)
    assert isinstance(data[0], tuple)


def test_emnist_letters_labels_start_at_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torchvision.datasets, "EMNIST", fake_torchvision("NHW", []))
    data = EMNIST()
    np.testing.assert_array_equal(data.targets, [0, 1, 2, 3, 4, 5])
    assert data.num_classes == 26


def test_missing_data_asks_for_download(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(**kwargs: Any) -> None:
        raise RuntimeError("Dataset not found. You can use download=True to download it")

    monkeypatch.setattr(torchvision.datasets, "CIFAR10", missing)
    with pytest.raises(FileNotFoundError, match=r"CIFAR10 was not found .* under root='nowhere'; pass download=True"):
        CIFAR10(root="nowhere")
    # With download=True it failed to download: the same error type, saying where the files go.
    with pytest.raises(FileNotFoundError, match=r"CIFAR10 could not be downloaded to root='nowhere' \(Dataset not found\. .*"
                       r"copy its files to nowhere/cifar-10-python.tar.gz"):
        CIFAR10(root="nowhere", download=True)


def test_channel_mismatch_is_reported() -> None:
    class Source:
        data = np.zeros((2, 3, 4, 4), dtype=np.uint8)
        labels = np.zeros(2)

    with pytest.raises(ValueError, match=r"expected 1 channel\(s\), got images of shape \[3, 4, 4\]"):
        materialise(Source(), mean=(0.5,), std=(0.5,))


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: EMNIST(split_name="bogus"), r"split_name must be one of \[.*'letters'.*\], got 'bogus'"),
        (lambda: SVHN(split="val"), r"split must be one of \['train', 'test', 'extra'\], got 'val'"),
    ],
)
def test_bad_split_names(make, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        make()


def test_a_failed_download_removes_only_what_it_created(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    from urllib.error import URLError

    def offline(*, root: str, download: bool, **kwargs: Any) -> None:
        (tmp_path / "cifar-10-batches-py").mkdir()
        (tmp_path / "cifar-10-python.tar.gz").write_bytes(b"partial")
        raise URLError("[Errno 101] Network is unreachable")

    monkeypatch.setattr(torchvision.datasets, "CIFAR10", offline)
    (tmp_path / "MNIST").mkdir()  # another dataset, already there
    with pytest.raises(
        FileNotFoundError,
        match=rf"CIFAR10 could not be downloaded to root='{tmp_path}' \(<urlopen error \[Errno 101\] Network is unreachable>\)",
    ):
        CIFAR10(root=str(tmp_path), download=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["MNIST"]
