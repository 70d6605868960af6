"""RandomCropFlip: a seeded, batch-level crop-and-flip, against a per-sample reference; its use in client batches."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import torchvision.datasets

from fl_lightning.data import CIFAR10, client_batches
from fl_lightning.data.augment import RandomCropFlip, augmentation_generator
from fl_lightning.data.datasets.in_memory import InMemoryDataset


def reference(images: torch.Tensor, generator: torch.Generator, padding: int, fill: list[float]) -> torch.Tensor:
    """torchvision's RandomCrop(padding) + RandomHorizontalFlip, one sample at a time, same draws."""
    b, c, h, w = images.shape
    dy = torch.randint(0, 2 * padding + 1, (b,), generator=generator)
    dx = torch.randint(0, 2 * padding + 1, (b,), generator=generator)
    flips = torch.rand(b, generator=generator) < 0.5
    out = []
    for i in range(b):
        channels = [F.pad(images[i, ch], (padding,) * 4, value=fill[ch]) for ch in range(c)]
        crop = torch.stack(channels)[:, dy[i] : dy[i] + h, dx[i] : dx[i] + w]
        out.append(crop.flip(-1) if flips[i] else crop)
    return torch.stack(out)


def test_matches_a_per_sample_crop_and_flip():
    images = torch.randn(16, 3, 6, 5)
    fill = [-1.0, 0.5, 2.0]
    got = RandomCropFlip(padding=2, fill=fill)(images, torch.Generator().manual_seed(3))
    want = reference(images, torch.Generator().manual_seed(3), 2, fill)
    assert torch.equal(got, want)
    assert not torch.equal(got, images)


def test_no_padding_and_no_flip_is_the_identity():
    images = torch.randn(4, 1, 5, 5)
    assert torch.equal(RandomCropFlip(padding=0, flip=False)(images, torch.Generator()), images)


@pytest.mark.parametrize(
    ("kwargs", "images", "match"),
    [({"padding": -1}, torch.zeros(1, 1, 2, 2), "padding"), ({"fill": [0.0, 1.0]}, torch.zeros(1, 3, 2, 2), "fill"), ({}, torch.zeros(3, 2, 2), "B, C, H, W")],
)
def test_bad_input_is_rejected(kwargs, images, match):
    with pytest.raises(ValueError, match=match):
        RandomCropFlip(**kwargs)(images, torch.Generator())


class Augmented(InMemoryDataset):
    def __init__(self) -> None:
        super().__init__(inputs=torch.randn(20, 3, 4, 4, generator=torch.Generator().manual_seed(0)), labels=torch.arange(20) % 4, num_classes=4)
        self.train_transform = RandomCropFlip(padding=1)


def stream(dataset, seed: int) -> list[tuple[torch.Tensor, ...]]:
    return list(client_batches(dataset, np.arange(20), batch_size=8, num_epochs=2, generator=torch.Generator().manual_seed(seed)))


def test_client_batches_augment_deterministically_from_the_data_seed_without_changing_the_order():
    dataset = Augmented()
    first, again, other = stream(dataset, 7), stream(dataset, 7), stream(dataset, 8)
    for (x, y), (x2, y2) in zip(first, again):
        assert torch.equal(x, x2) and torch.equal(y, y2)
    assert any(not torch.equal(a[0], b[0]) for a, b in zip(first, other))
    plain = InMemoryDataset(inputs=dataset.tensors[0], labels=dataset.tensors[1], num_classes=4)
    unaugmented = stream(plain, 7)
    for (x, y), (raw, raw_y) in zip(first, unaugmented):
        assert torch.equal(y, raw_y)  # same data order
    expected = RandomCropFlip(padding=1)(unaugmented[0][0], augmentation_generator(torch.Generator().manual_seed(7)))
    assert torch.equal(first[0][0], expected)


def test_cifar_wrapper_pads_with_black(monkeypatch):
    class Fake:
        def __init__(self, **kwargs):
            self.data, self.targets = np.zeros((2, 4, 4, 3), dtype=np.uint8), [0, 1]

    monkeypatch.setattr(torchvision.datasets, "CIFAR10", Fake)
    assert CIFAR10().train_transform is None
    data = CIFAR10(augment=True)
    black = data.tensors[0][0, :, 0, 0]  # every pixel is black
    assert data.train_transform.fill == pytest.approx(black.tolist())
    augmented = data.train_transform(data.tensors[0], torch.Generator().manual_seed(0))
    assert torch.allclose(augmented, data.tensors[0])  # padding black onto black changes nothing


def test_per_image_standardization_is_tfs_formula_image_by_image():
    from fl_lightning.data.augment import per_image_standardization

    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (3, 5, 4, 3)).astype(np.float64)
    images[1] = 7.0  # flat: the floor 1/sqrt(N) divides, giving zeros
    got = per_image_standardization(torch.from_numpy(images).float()).double().numpy()
    for image, out in zip(images, got):
        expected = (image - image.mean()) / max(image.std(), 1 / np.sqrt(image.size))
        assert np.abs(out - expected).max() < 1e-5
    scaled = per_image_standardization(torch.from_numpy(images / 255).float(), scale=255.0)
    assert torch.allclose(scaled, torch.from_numpy(got).float(), atol=1e-5)  # the same values, scaled
    with pytest.raises(ValueError, match=r"expects a batch \[B, \.\.\.\] of images, got shape \[4\]"):
        per_image_standardization(torch.zeros(4))
    with pytest.raises(ValueError, match="`scale` must be > 0, got 0"):
        per_image_standardization(torch.zeros(2, 4), scale=0)
