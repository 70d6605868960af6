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


@pytest.mark.parametrize(("kwargs", "match"), [({"lr": 0.0}, "`lr` must be a finite number > 0"), ({"optimizer": "rmsprop"}, "`optimizer` must be")])
def test_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LinearRegression(**kwargs)


def test_the_proximal_and_linear_terms_reach_the_loss():
    # The mixins wrap training_step only if the class that lists them does not define its own: it once
    # did, and FedProx's mu (and FedSoft's lambda) silently changed nothing on this model.
    torch.manual_seed(0)
    model = LinearRegression(in_features=3, out_features=1)
    x, y = torch.randn(5, 3), torch.randn(5, 1)
    w = model.net.weight.detach()
    model.set_proximal_center({"net.weight": w + 1.0}, mu=2.0)
    model.set_linear_term({"net.weight": torch.full_like(w, 0.5)})
    output = model.training_step((x, y), 0)
    expected = F.mse_loss(model(x), y) + 0.5 * 2.0 * 3.0 + 0.5 * w.sum()
    torch.testing.assert_close(output["loss"], expected)
    torch.testing.assert_close(output["task_loss"], F.mse_loss(model(x), y))
