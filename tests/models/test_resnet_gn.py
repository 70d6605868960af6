"""ResNet-18 with GroupNorm against the layer list of the reference Keras model (``create_resnet18``)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fl_lightning.models import ResNet18GN


def reference_count(num_classes: int) -> int:
    """Parameters of ``resnet_models.create_resnet18(norm='group')``, layer by layer: bias-free convs, a
    norm (scale and offset per channel) before each conv but the first block's first, 1x1 projections."""
    conv = lambda k, c_in, c_out: k * k * c_in * c_out  # noqa: E731
    norm = lambda c: 2 * c  # noqa: E731
    total = conv(7, 3, 64) + norm(64)  # stem
    total += conv(3, 64, 64) + norm(64) + conv(3, 64, 64)  # stage 1, block 1 (no pre-norm)
    total += norm(64) + conv(3, 64, 64) + norm(64) + conv(3, 64, 64)
    for c_in, c_out in ((64, 128), (128, 256), (256, 512)):
        total += norm(c_in) + conv(3, c_in, c_out) + norm(c_out) + conv(3, c_out, c_out)  # block 1
        total += conv(1, c_in, c_out) + norm(c_out)  # its projection shortcut
        total += norm(c_out) + conv(3, c_out, c_out) + norm(c_out) + conv(3, c_out, c_out)  # block 2
    return total + norm(512) + 512 * num_classes + num_classes


def test_parameter_count_is_the_references():
    assert reference_count(100) == 11_227_812
    assert sum(p.numel() for p in ResNet18GN().parameters()) == reference_count(100)


def test_group_norm_with_two_groups_everywhere_and_no_batch_norm():
    model = ResNet18GN()
    norms = [m for m in model.modules() if isinstance(m, nn.GroupNorm)]
    assert len(norms) == 1 + 3 + 4 * 3 + 3 + 1 and {m.num_groups for m in norms} == {2}
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())


def test_cifar_crops_give_logits_and_the_stages_keep_the_resolution():
    model = ResNet18GN().eval()
    assert model(torch.rand(2, 3, 32, 32)).shape == (2, 100)
    stem = model.net[:4](torch.rand(1, 3, 24, 24))
    assert stem.shape[-2:] == model.net[:-5](torch.rand(1, 3, 24, 24)).shape[-2:] == (6, 6)


def test_training_crops_are_random_windows_maybe_mirrored_and_evaluation_crops_central():
    model = ResNet18GN()
    x = torch.arange(2 * 3 * 32 * 32, dtype=torch.float32).reshape(2, 3, 32, 32)
    assert torch.equal(model.eval()._cropped(x, 24), x[..., 4:28, 4:28])
    torch.manual_seed(0)
    crops = model.train()._cropped(x, 24)
    windows = {(i, top, left, flip) for i in range(2) for top in range(9) for left in range(9) for flip in (False, True)
               if torch.equal(crops[i], (lambda w: w.flip(-1) if flip else w)(x[i, :, top : top + 24, left : left + 24]))}
    assert {i for i, *_ in windows} == {0, 1}  # every sample is a window of its own image
    with pytest.raises(ValueError, match="larger than the 16x16 images"):
        model(torch.rand(1, 3, 16, 16))


def test_bad_arguments():
    with pytest.raises(ValueError, match="`groups` must divide"):
        ResNet18GN(groups=3)
    with pytest.raises(ValueError, match="`crop` must be an integer >= 1, got 0"):
        ResNet18GN(crop=0)
