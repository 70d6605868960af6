"""sample_metrics_many: several weight sets scored in one (vmapped) pass, equal to scoring each in turn."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fl_lightning.models import CNN
from fl_lightning.evaluation.probe import WeightSets, sample_metrics, sample_metrics_many


def _states(module: nn.Module, count: int) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [
        {n: t + 0.1 * torch.randn(t.shape, generator=g) if t.is_floating_point() else t.clone() for n, t in module.state_dict().items()}
        for _ in range(count)
    ]


def _batches():
    g = torch.Generator().manual_seed(2)
    return [(torch.randn(5, 1, 8, 8, generator=g), torch.randint(0, 10, (5,), generator=g)) for _ in range(3)]


@pytest.mark.parametrize("batched", [True, False])
def test_equals_loading_each_state_and_probing(batched):
    torch.manual_seed(0)
    module = CNN(image_size=8, batch_norm=True)
    module.train()
    states = _states(module, 3)
    before = {n: t.clone() for n, t in module.state_dict().items()}
    many = sample_metrics_many(module, states, _batches(), batched=batched)
    assert many["loss"].shape == (3, 15) and many["correct"].shape == (3, 15)
    for i, state in enumerate(states):
        other = CNN(image_size=8, batch_norm=True)
        other.load_state_dict(state)
        single = sample_metrics(other, _batches())
        torch.testing.assert_close(many["loss"][i], single["loss"], rtol=1e-5, atol=1e-5)
        assert torch.equal(many["correct"][i], single["correct"])
    # the module's own weights, BatchNorm statistics and mode are untouched
    assert all(torch.equal(t, before[n]) for n, t in module.state_dict().items())
    assert module.training


def test_prepared_weight_sets_are_stacked_once_and_score_the_same():
    torch.manual_seed(0)
    module = CNN(image_size=8, batch_norm=True)
    states = _states(module, 3)
    weights = WeightSets(module, states)
    first = sample_metrics_many(module, weights, _batches())
    stacked = weights.stacked
    second = sample_metrics_many(module, weights, _batches()[:1])
    assert weights.stacked is stacked  # reused: probing N clients stacks the centres once
    assert torch.equal(first["loss"], sample_metrics_many(module, states, _batches())["loss"])
    assert torch.equal(second["loss"], first["loss"][:, :5])


class _Branchy(CNN):
    def sample_metrics(self, batch):
        if float(self.net[0].weight.sum()) > 1e9:  # data-dependent Python control flow: vmap cannot trace it
            raise AssertionError
        return super().sample_metrics(batch)


def test_falls_back_to_one_pass_per_state_when_vmap_fails():
    torch.manual_seed(0)
    module = _Branchy(image_size=8)
    states = _states(module, 2)
    with pytest.warns(UserWarning, match="cannot be vmapped"):
        batched = sample_metrics_many(module, states, _batches())
    sequential = sample_metrics_many(module, states, _batches(), batched=False)
    torch.testing.assert_close(batched["loss"], sequential["loss"])


def test_needs_a_state_and_samples():
    module = CNN(image_size=8)
    with pytest.raises(ValueError, match="at least one weight set"):
        sample_metrics_many(module, [], _batches())
    with pytest.raises(ValueError, match="found no samples"):
        sample_metrics_many(module, _states(module, 2), [])
