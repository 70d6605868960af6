"""The loss probe: exact mean loss/accuracy, no side effects on BatchNorm or training mode."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fl_lightning.data import FederatedDataModule, InMemoryDataset
from fl_lightning.server.federation import Federation
from fl_lightning.models import CNN, MLP
from fl_lightning.evaluation.probe import probe, sample_metrics


def dataset(n: int = 40, image: bool = False) -> InMemoryDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 1, 8, 8, generator=g) if image else torch.randn(n, 5, generator=g)
    return InMemoryDataset(inputs=x, labels=torch.randint(0, 3, (n,), generator=g), num_classes=3)


def test_probe_equals_direct_computation():
    torch.manual_seed(0)
    model, data = MLP(in_features=5, hidden=(4,), num_classes=3), dataset()
    dm = FederatedDataModule(data, num_clients=2, batch_size=4)
    fed = Federation(data=dm, module=model, clients_per_round=1, seed=0, param_names=frozenset())
    result = probe(model, fed.probe_batches(1, batch_size=7))
    x, y = data.tensors[0][dm.client_indices(1)], data.tensors[1][dm.client_indices(1)]
    with torch.no_grad():
        logits = model(x)
    assert result.loss == pytest.approx(F.cross_entropy(logits, y).item(), rel=1e-6)
    assert result.accuracy == pytest.approx((logits.argmax(-1) == y).float().mean().item())
    assert result.num_samples == len(y)


def test_probe_leaves_batchnorm_and_training_mode_untouched():
    torch.manual_seed(0)
    model = CNN(in_channels=1, image_size=8, num_classes=3, batch_norm=True)
    model.train()
    model.net[1].eval()  # a submodule the user froze in eval mode stays so
    before = {k: v.clone() for k, v in model.state_dict().items()}
    sample_metrics(model, [tuple(t[:10] for t in dataset(image=True).tensors)])
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert model.training and model.net[0].training and not model.net[1].training


def test_probe_needs_sample_metrics():
    with pytest.raises(TypeError, match="cannot be probed: implement `sample_metrics"):
        probe(torch.nn.Linear(2, 2), [])  # type: ignore[arg-type]
