"""LinearRegression: the MSE model of FedSoft's synthetic experiments."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fl_lightning.models import LinearRegression


def test_losses_and_per_sample_metrics():
    torch.manual_seed(0)
    model = LinearRegression(in_features=3, out_features=2)
    x, y = torch.randn(5, 3), torch.randn(5, 2)
    per_sample = model.sample_metrics((x, y))["loss"]
    assert per_sample.shape == (5,)
    torch.testing.assert_close(per_sample.mean(), F.mse_loss(model(x), y))
    torch.testing.assert_close(model.training_step((x, y), 0), F.mse_loss(model(x), y))
    assert model.net.bias is None  # no intercept by default, as the paper's Linear(10 -> 1)


@pytest.mark.parametrize(("optimizer", "kind"), [("adam", torch.optim.Adam), ("sgd", torch.optim.SGD)])
def test_optimizers(optimizer, kind):
    assert isinstance(LinearRegression(optimizer=optimizer).configure_optimizers(), kind)


@pytest.mark.parametrize(("kwargs", "match"), [({"lr": 0.0}, "`lr` must be > 0"), ({"optimizer": "rmsprop"}, "`optimizer` must be")])
def test_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LinearRegression(**kwargs)
