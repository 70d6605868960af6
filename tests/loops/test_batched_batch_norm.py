"""BatchNorm in the batched executor's padded steps equals torch's on each client's real samples alone: outputs'
loss, gradients (affine tensors and input, through the statistics) and buffer updates, in float64."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import Tensor, nn
from torch.func import functional_call, vmap

from fl_lightning.loops.batched_batch_norm import RealSampleNorms

#: Each client's real samples in a batch padded to 5.
SIZES = [5, 3, 2]
#: A layer and one sample's input shape: (N, C), (N, C, L) and (N, C, H, W) batches.
LAYERS = {
    "batchnorm1d": (nn.BatchNorm1d, (4,)),
    "batchnorm1d-sequence": (nn.BatchNorm1d, (4, 3)),
    "batchnorm2d": (nn.BatchNorm2d, (4, 3, 2)),
}


def per_client(layer: nn.Module, g: torch.Generator) -> dict[str, Tensor]:
    """Each client's own affine tensors and buffers, stacked, made to differ between clients."""
    k = len(SIZES)
    tensors = {name: t.detach().repeat(k, *(1,) * t.dim()) for name, t in layer.state_dict().items()}
    for name in ("weight", "bias", "running_mean"):
        tensors[name] = tensors[name] + torch.randn(tensors[name].shape, generator=g, dtype=torch.float64)
    tensors["running_var"] = tensors["running_var"] + torch.rand(tensors["running_var"].shape, generator=g, dtype=torch.float64)
    tensors["num_batches_tracked"] = torch.tensor([3, 0, 1])
    return tensors


@pytest.mark.parametrize("momentum", [0.1, None])
@pytest.mark.parametrize("layer_name", list(LAYERS))
def test_a_padded_batch_normalises_over_each_clients_real_samples(layer_name: str, momentum: float | None) -> None:
    kind, sample_shape = LAYERS[layer_name]
    layer = kind(4, momentum=momentum, dtype=torch.float64)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(len(SIZES), max(SIZES), *sample_shape, generator=g, dtype=torch.float64, requires_grad=True)
    target = torch.randn(x.shape, generator=g, dtype=torch.float64)
    mask = torch.arange(max(SIZES)) < torch.tensor(SIZES).unsqueeze(1)
    tensors = per_client(layer, g)
    start = {name: t.clone() for name, t in tensors.items()}
    affine = {name: tensors.pop(name).requires_grad_() for name in ("weight", "bias")}
    norms = RealSampleNorms(layer)

    def client_loss(affine: dict[str, Tensor], buffers: dict[str, Tensor], x: Tensor, mask: Tensor, target: Tensor) -> Tensor:
        def sample_loss(sample: Tensor, real: Tensor, target: Tensor) -> Tensor:
            with norms.over(real):
                return ((functional_call(layer, {**affine, **buffers}, (sample.unsqueeze(0),)) - target) ** 2).mean()

        losses = vmap(sample_loss)(x, mask, target)
        return torch.where(mask, losses, 0).sum() / mask.sum()

    losses = vmap(client_loss)(affine, tensors, x, mask, target)
    grads = torch.autograd.grad(losses.sum(), [affine["weight"], affine["bias"], x])
    assert norms.one_value_per_sample == (sample_shape == (4,))
    assert layer.forward.__self__ is layer  # the layer's own forward is back
    for k, n in enumerate(SIZES):
        alone = copy.deepcopy(layer)
        alone.load_state_dict({name: t[k] for name, t in start.items()})
        real = x[k, :n].detach().requires_grad_()
        loss = ((alone(real) - target[k, :n]) ** 2).mean()  # torch's BatchNorm in training mode
        want = torch.autograd.grad(loss, [alone.weight, alone.bias, real])
        assert float(losses[k].detach()) == pytest.approx(float(loss.detach()), abs=1e-13)
        for got, expected in zip((grads[0][k], grads[1][k], grads[2][k, :n]), want):
            assert torch.allclose(got, expected, rtol=0, atol=1e-13)
        assert not grads[2][k, n:].any()  # the padding gets no gradient, through the statistics neither
        for name, t in alone.state_dict().items():
            if name not in affine:
                assert torch.allclose(tensors[name][k], t, rtol=0, atol=1e-13), name
