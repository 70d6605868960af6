"""PflCNN: pfl-research's CIFAR-10 benchmark CNN."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fl_lightning.models import PflCNN


def test_architecture_matches_pfl_research():
    model = PflCNN()
    shapes = [tuple(p.shape) for p in model.parameters()]
    # simple_cnn(input_shape=(32, 32, 3), num_outputs=10): 30x30 -> 28x28 -> pooled 14x14 x 64 = 12544.
    assert shapes == [(32, 3, 3, 3), (32,), (64, 32, 3, 3), (64,), (128, 12544), (128,), (10, 128), (10,)]
    assert sum(p.numel() for p in model.parameters()) == 1_626_442
    assert [m.p for m in model.net if isinstance(m, nn.Dropout)] == [0.25, 0.5]
    assert model(torch.zeros(2, 3, 32, 32)).shape == (2, 10)


def test_xavier_uniform_weights():
    torch.manual_seed(0)
    fc = PflCNN().net[7]
    bound = (6 / (fc.in_features + fc.out_features)) ** 0.5  # Glorot uniform; PyTorch's default is far smaller here
    assert fc.weight.abs().max() <= bound
    assert fc.weight.abs().max() > 0.9 * bound


def test_other_image_sizes_and_bad_input():
    assert PflCNN(in_channels=1, image_size=28)(torch.zeros(1, 1, 28, 28)).shape == (1, 10)
    with pytest.raises(ValueError, match="`image_size` must be >= 6"):
        PflCNN(image_size=5)
