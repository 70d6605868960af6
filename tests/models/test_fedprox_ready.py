"""Every benchmark model adds FedProx's proximal term: ProximalMixin's training_step wraps the model's own."""

from __future__ import annotations

import pytest
import torch

from fl_lightning.models import (
    CNN,
    MLP,
    EmnistCNN,
    FemnistCNN,
    ResNet18GN,
    ShakespeareLSTM,
    ShakespeareStackedLSTM,
    StackOverflowLSTM,
    TagLogisticRegression,
)

CASES = {
    "femnist": (lambda: FemnistCNN(), (torch.rand(2, 784), torch.tensor([0, 61]))),
    "leaf_shakespeare": (lambda: ShakespeareStackedLSTM(hidden=8), (torch.randint(0, 80, (2, 5)), torch.tensor([1, 2]))),
    "emnist": (lambda: EmnistCNN(), (torch.rand(2, 1, 28, 28), torch.tensor([3, 4]))),
    "shakespeare": (lambda: ShakespeareLSTM(hidden=8), (torch.randint(1, 90, (2, 5)), torch.randint(0, 90, (2, 5)))),
    "stackoverflow": (lambda: StackOverflowLSTM(vocab_size=20, hidden=8), (torch.randint(1, 24, (2, 5)), torch.randint(0, 24, (2, 5)))),
    "tags": (lambda: TagLogisticRegression(num_words=12, num_tags=5), (torch.rand(2, 12), torch.tensor([[1.0, 0, 0, 1, 0], [0, 1, 0, 0, 0]]))),
    "resnet": (lambda: ResNet18GN(num_classes=10), (torch.rand(2, 3, 32, 32), torch.tensor([1, 9]))),
    # FedSoft's rotated-digits models (benchmarks/fedsoft.py --data rotated-digits)
    "mlp": (lambda: MLP(in_features=64, hidden=(100,)), (torch.rand(2, 64), torch.tensor([0, 7]))),
    "cnn": (lambda: CNN(in_channels=1, image_size=8), (torch.rand(2, 1, 8, 8), torch.tensor([2, 5]))),
}


@pytest.mark.parametrize("name", CASES)
def test_proximal_term_is_added_to_the_models_own_loss(name: str):
    make, batch = CASES[name]
    torch.manual_seed(0)
    model = make().eval()  # no dropout or random crops: the two losses see the same function
    plain = model.training_step(batch, 0)
    plain = plain["loss"] if isinstance(plain, dict) else plain
    model.set_proximal_center({n: p.detach() + 1.0 for n, p in model.named_parameters()}, mu=0.5)
    out = model.training_step(batch, 0)
    expected = 0.5 / 2 * sum(p.numel() for p in model.parameters())  # ||w - (w + 1)||^2 = number of weights
    assert out["regularizer"].item() == pytest.approx(expected, rel=1e-5)
    assert out["loss"].item() == pytest.approx(plain.item() + expected, rel=1e-5)
