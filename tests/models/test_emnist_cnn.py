"""EmnistCNN: Reddi et al.'s EMNIST CNN, against the Keras summary of the reference model."""

from __future__ import annotations

import torch

from fl_lightning.models import EmnistCNN


def test_parameter_counts_are_the_references():
    # create_conv_dropout_model(only_digits=True): Keras reports 1,199,882 (320 + 18,496 + 1,179,776 + 1,290).
    assert sum(p.numel() for p in EmnistCNN(num_classes=10).parameters()) == 1_199_882
    assert sum(p.numel() for p in EmnistCNN().parameters()) == 320 + 18_496 + 1_179_776 + (128 + 1) * 62 == 1_206_590


def test_glorot_normal_weights_and_62_outputs():
    torch.manual_seed(0)
    model = EmnistCNN()
    fc = model.net[7]
    std = (2 / (fc.in_features + fc.out_features)) ** 0.5
    assert abs(fc.weight.std().item() - std) < 0.05 * std
    assert model(torch.zeros(2, 1, 28, 28)).shape == (2, 62)
