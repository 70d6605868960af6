"""pfl-research's FLAIR model: torchvision's ResNet-18 with GroupNorm, multi-label, crops and ImageNet normalisation."""

from __future__ import annotations

import torch
from torch import nn

from fl_lightning.models import FlairResNet18


def test_shape_and_normalisation_follow_pfl() -> None:
    model = FlairResNet18(num_classes=17)
    norms = [m for m in model.modules() if isinstance(m, nn.GroupNorm)]
    assert not any(isinstance(m, nn.BatchNorm2d) for m in model.modules())
    assert {(m.num_groups, m.num_channels) for m in norms} == {(32, 64), (32, 128), (32, 256), (32, 512)}
    # torchvision's ResNet-18 (11,689,512 parameters with 1,000 classes) with a 17-way head; GroupNorm has BatchNorm's affine pairs.
    assert sum(p.numel() for p in model.parameters()) == 11_689_512 - 512 * 1000 - 1000 + 512 * 17 + 17
    x = torch.rand(2, 3, 40, 40)
    model.eval()
    assert model.eval_transform(x).shape == (2, 3, 224, 224)  # Resize(224)
    # Normalize with ImageNet's statistics: a constant image of the channel means becomes zero.
    mean = torch.tensor([0.485, 0.456, 0.406])[:, None, None].expand(3, 224, 224)
    torch.testing.assert_close(model.eval_transform(mean[None]), torch.zeros(1, 3, 224, 224), atol=1e-6, rtol=0)
    model.train()
    assert model.train_transform(x).shape == (2, 3, 224, 224)  # RandomResizedCrop(224)


def test_training_loss_is_the_mean_binary_cross_entropy() -> None:
    torch.manual_seed(0)
    model = FlairResNet18(num_classes=5, image_size=None).eval()
    x, y = torch.rand(3, 3, 16, 16), (torch.rand(3, 5) > 0.5).float()
    model.train_transform = model.eval_transform  # no random flip: compare the same forward
    logits = model(x)
    model.train()
    expected = nn.functional.binary_cross_entropy_with_logits(logits, y)
    torch.testing.assert_close(model.training_step((x, y), 0), expected)
    metrics = model.sample_metrics((x, y))
    torch.testing.assert_close(metrics["correct"], ((logits > 0).float() == y).float().mean(-1))
