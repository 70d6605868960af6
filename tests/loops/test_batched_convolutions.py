"""Convolutions under the batched executor (issue 41): ``vmap``'s own rule for ``conv1d`` / ``conv2d`` (the clients
folded into the groups of one grouped convolution) equals the Lightning executor's per-client convolutions to 1e-6
in float32 after 2 rounds of ragged clients, over stride, padding, dilation, groups and bias; on batches that need
padding (a per-sample ``vmap`` inside the clients' one) too."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import Tensor, nn

from fl_lightning.models.classifier import ClassificationModule

from .test_batched_clients import fit, max_diff

TOL = 1e-6

#: ``nn.Conv{1,2}d`` keyword arguments of the two layers (the second takes the first's 4 output channels).
VARIANTS = {
    "plain": {},
    "stride-2": {"stride": 2},
    "padding-1": {"padding": 1},
    "padding-same-dilation-2": {"padding": "same", "dilation": 2},
    "groups-2-no-bias": {"groups": 2, "bias": False},
    "stride-2-padding-2-dilation-2-groups-2": {"stride": 2, "padding": 2, "dilation": 2, "groups": 2},
}


class ConvNet(ClassificationModule):
    """Two convolutions (``conv1d`` over the 8 rows of an 8 x 8 image as channels, or ``conv2d`` over the image), ReLU,
    a linear head."""

    def __init__(self, spatial: int, conv: dict[str, Any]) -> None:
        super().__init__(num_classes=4, lr=0.1, momentum=0.5)
        layer = nn.Conv1d if spatial == 1 else nn.Conv2d
        in_channels = 8 if spatial == 1 else 2
        self.spatial = spatial
        convs = nn.Sequential(layer(in_channels, 4, 3, **conv), nn.ReLU(), layer(4, 4, 3, **conv), nn.ReLU(), nn.Flatten())
        features = convs(torch.zeros(1, in_channels, *(8,) * spatial)).shape[1]
        self.net = nn.Sequential(*convs, nn.Linear(features, 4))

    def forward(self, x: Tensor) -> Tensor:
        # [N, 1, 8, 8]: conv1d reads the rows as channels; conv2d gets the image twice (2 channels, for groups=2).
        return self.net(x.squeeze(1) if self.spatial == 1 else x.expand(-1, 2, -1, -1))


@pytest.mark.parametrize("spatial", [1, 2], ids=["conv1d", "conv2d"])
@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("padded", [False, True], ids=["equal-batches", "padded-batches"])
def test_batched_convolutions_equal_lightnings(spatial: int, variant: str, padded: bool) -> None:
    data = {} if padded else {"batch_size": 4, "drop_last": True}

    def model() -> ConvNet:
        return ConvNet(spatial, VARIANTS[variant])

    want, want_log, _ = fit("lightning", model, image=True, data=data)
    got, log, _ = fit("batched", model, image=True, data=data)
    assert log.updates.keys() == want_log.updates.keys()
    for key, update in want_log.updates.items():
        assert max_diff(log.updates[key].payload, update.payload) <= TOL, key
    assert max_diff(got.state_dict(), want.state_dict()) <= TOL
