"""Adaptive clipping (Andrew et al. 2021): the geometric update and the split noise multiplier, by hand."""

from __future__ import annotations

import math

import pytest
import torch

from fl_lightning import AdaptiveClipping


def test_geometric_update_from_the_noised_count():
    clipping = AdaptiveClipping(target_quantile=0.6, learning_rate=0.2, count_noise_std=0.5)
    noise = torch.randn((), generator=torch.Generator().manual_seed(7), dtype=torch.float64).item() * 0.5
    clip, fraction = clipping.next_clip_norm(
        2.0, unclipped=3.0, expected_clients=10.0, generator=torch.Generator().manual_seed(7)
    )
    assert fraction == pytest.approx((3.0 + noise) / 10.0)
    assert clip == pytest.approx(2.0 * math.exp(-0.2 * (fraction - 0.6)))
    assert clip > 2.0  # fewer than 60 % fit: the clip norm grows


def test_update_noise_multiplier_splits_the_budget():
    clipping = AdaptiveClipping(count_noise_std=1.0)
    z_update = clipping.update_noise_multiplier(1.0, expected_clients=100)
    assert z_update == pytest.approx((1.0 - 0.25) ** -0.5)
    assert (z_update**-2 + (2 * 1.0) ** -2) ** -0.5 == pytest.approx(1.0)  # together: one mechanism of z = 1
    assert AdaptiveClipping().noise_std(expected_clients=40) == 2.0  # the paper's m / 20


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"target_quantile": 0.0}, "target_quantile"),
        ({"target_quantile": 1.0}, "target_quantile"),
        ({"learning_rate": 0.0}, "learning_rate"),
        ({"count_noise_std": -1.0}, "count_noise_std"),
    ],
)
def test_bad_input_is_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        AdaptiveClipping(**kwargs)
