"""``benchmarks/conv_ceiling.py``'s arithmetic count for pfl-research's CNN, against the count by hand from the
layer shapes (the GFLOP/s it reports, and so the bound it records, rest on it)."""

from __future__ import annotations

import pytest
from torch import nn

from fl_lightning.models import PflCNN

from .benchmark_scripts import import_benchmark


@pytest.fixture
def flops_per_sample(monkeypatch: pytest.MonkeyPatch):
    return import_benchmark(monkeypatch, "conv_ceiling").flops_per_sample


def test_pfl_cnn_flops_match_the_layer_shapes(flops_per_sample) -> None:
    # Multiply-adds x 2 of each layer on one 3x32x32 image: two unpadded 3x3 convolutions (30x30x32 from 3
    # channels, 28x28x64 from 32), dense 64*14*14 -> 128 and 128 -> 10.
    conv1, conv2 = 2 * 30 * 30 * 32 * 3 * 9, 2 * 28 * 28 * 64 * 32 * 9
    dense = 2 * (64 * 14 * 14 * 128 + 128 * 10)
    # Backward is twice the forward, less the input gradient of the first layer, which autograd skips.
    assert flops_per_sample(PflCNN().net, (3, 32, 32)) == 3 * (conv1 + conv2 + dense) - conv1


def test_layers_without_arithmetic_count_nothing(flops_per_sample) -> None:
    net = nn.Sequential(nn.Flatten(), nn.ReLU(), nn.Linear(4, 2))
    assert flops_per_sample(net, (2, 2)) == 2 * 4 * 2 * 3 - 2 * 4 * 2
