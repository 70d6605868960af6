"""The digits-sized stand-in for the FedMRN paper's CNN4 (issue 27): CNN4's blocks, three of them."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fl_lightning.data import Digits
from fl_lightning.models.masked_networks import CNN4

DIGITS_CHANNELS = (32, 64, 128)


def test_three_blocks_build_on_8x8_digits_with_batchnorm_after_every_conv():
    torch.manual_seed(0)
    model = CNN4(image_size=8, channels=DIGITS_CHANNELS)
    layers = list(model.net)
    convs = [i for i, m in enumerate(layers) if isinstance(m, nn.Conv2d)]
    assert len(convs) == 3 and sum(isinstance(m, nn.MaxPool2d) for m in layers) == 3
    for i in convs:
        assert layers[i].bias is None
        assert isinstance(layers[i + 1], nn.BatchNorm2d) and layers[i + 1].num_features == layers[i].out_channels
        assert isinstance(layers[i + 2], nn.ReLU) and isinstance(layers[i + 3], nn.MaxPool2d)
    head = layers[-1]
    assert isinstance(head, nn.Linear) and head.bias is None and head.in_features == 128  # 8 -> 4 -> 2 -> 1
    x = torch.stack([Digits(split="train", as_image=True)[i][0] for i in range(16)])
    assert x.shape == (16, 1, 8, 8) and model(x).shape == (16, 10)
    model.install_masked_noise()  # every conv and the head are masked: 32*9 + 64*32*9 + 128*64*9 + 128*10 weights
    assert sum(model.get_parameter(n).numel() for n in model.masked_parameter_names) == 93_728


def test_conv_and_linear_weights_follow_the_authors_init():
    torch.manual_seed(0)
    model = CNN4(image_size=8, channels=DIGITS_CHANNELS)
    weights = torch.cat([m.weight.flatten() for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Linear))])
    # N(0, 0.01²) over 93,728 draws: sample std within 1 % of 0.01, mean within 5 standard errors of 0.
    assert weights.std().item() == pytest.approx(0.01, rel=0.01)
    assert abs(weights.mean().item()) < 5 * 0.01 / weights.numel() ** 0.5
    bn = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    assert all(torch.equal(m.weight, torch.ones_like(m.weight)) and not m.bias.any() for m in bn)  # BN's default init


def test_default_channels_are_the_papers_cnn4_and_bad_input_is_named():
    assert CNN4().hparams.channels == (32, 64, 128, 256)
    with pytest.raises(ValueError, match="`image_size` must be >= 8 .* got 4"):
        CNN4(image_size=4, channels=DIGITS_CHANNELS)
    with pytest.raises(ValueError, match=r"`channels` must be .*, got \(32, 0\)"):
        CNN4(image_size=8, channels=(32, 0))
