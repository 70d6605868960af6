"""Many LoRA adapters over one frozen base under the batched executor (issue 41): the clients' adapters are stacked,
the base is not, attention runs without ``vmap``'s per-client fallback, and the weights equal the Lightning
executor's (float32, 1e-6) with AdamW (LoRA's recipe) and SGD, on ragged clients. A tiny GPT-2 from a config."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor
from torch.func import vmap

pytest.importorskip("peft")
pytest.importorskip("transformers")

from fl_lightning.data import FederatedDataModule, Natural, SyntheticTopicText  # noqa: E402
from fl_lightning.loops import batched_sgd  # noqa: E402
from fl_lightning.loops.batched_attention import attention, folded_attention  # noqa: E402
from fl_lightning.models import LoRACausalLM  # noqa: E402

from ..quiet import quiet_trainer  # noqa: E402
from .test_batched_clients import max_diff  # noqa: E402

CLIENTS_PER_ROUND = 4
#: vmap's warning when an op has no batching rule and runs once per client.
FALLBACK = "performance drop because we have not yet implemented the batching rule"


class TinyLoRA(LoRACausalLM):
    """The tiny GPT-2 LoRA (2 layers, width 32), AdamW as configured or plain SGD."""

    def __init__(self, optimizer: str = "adamw", lr: float = 0.01) -> None:
        config = {
            "model_type": "gpt2", "vocab_size": 32, "n_positions": 16, "n_embd": 32, "n_layer": 2, "n_head": 2,
            "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0, "bos_token_id": 0, "eos_token_id": 0,
        }  # fmt: skip
        super().__init__(config=config, r=4, lora_alpha=8, target_modules=["c_attn", "c_proj", "c_fc"], lr=lr,
                         weight_decay=0.01)  # fmt: skip
        self.optimizer = optimizer

    def configure_optimizers(self) -> torch.optim.Optimizer:
        if self.optimizer == "sgd":
            return torch.optim.SGD([p for p in self.parameters() if p.requires_grad], lr=0.5, momentum=0.9)
        return super().configure_optimizers()


def fit(executor: str, optimizer: str, lr: float = 0.01, **kwargs: Any) -> TinyLoRA:
    """2 rounds of 4 of 6 writers, one local epoch each (unequal sizes: ragged steps and a short last batch)."""
    text = SyntheticTopicText(num_clients=6, vocab_size=32, seq_len=16, sequences_per_client=(6, 14), seed=0)
    data = FederatedDataModule(text, partitioner=Natural(), num_clients=6, batch_size=4, seed=0)
    model = TinyLoRA(optimizer, lr)
    kwargs = {"clients_per_round": CLIENTS_PER_ROUND, "max_epochs": 2, "limit_val_batches": 0, **kwargs}
    trainer = quiet_trainer(client_executor=executor, **kwargs)
    trainer.fit(model, datamodule=data)
    return model


# AdamW divides by sqrt(v) + eps, so a gradient entry near eps (1e-8) carries float32's rounding of the batched
# matrix products (another summation order) into the weights: 5.6e-7 at lr=0.01 (the config's), 1.2e-5 at lr=0.02.
# Float64 shows the arithmetic itself is Lightning's.
@pytest.mark.parametrize(
    ("optimizer", "precision", "tol"), [("adamw", "32-true", 1e-6), ("sgd", "32-true", 1e-6), ("adamw", "64-true", 1e-12)]
)
def test_batched_lora_equals_lightning_without_the_attention_fallback(optimizer: str, precision: str, tol: float) -> None:
    reference = fit("lightning", optimizer, precision=precision)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        batched = fit("batched", optimizer, precision=precision)
    assert not [w for w in caught if FALLBACK in str(w.message)]
    adapters = [n for n, p in batched.named_parameters() if p.requires_grad]
    assert adapters and all(not torch.equal(batched.state_dict()[n], TinyLoRA().state_dict()[n]) for n in adapters if "lora_B" in n)
    assert max_diff(batched.state_dict(), reference.state_dict()) <= tol


def test_only_the_adapters_are_stacked(monkeypatch: pytest.MonkeyPatch) -> None:
    states: list[batched_sgd.StackedState] = []
    init = batched_sgd.StackedState.__init__

    def recording(self: batched_sgd.StackedState, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        states.append(self)

    monkeypatch.setattr(batched_sgd.StackedState, "__init__", recording)
    model = fit("batched", "adamw", max_epochs=1)
    shapes = {n: p.shape for n, p in model.named_parameters() if p.requires_grad}
    frozen = [n for n, p in model.named_parameters() if not p.requires_grad]
    assert states and frozen and all("lora_" in n for n in shapes)
    for state in states:
        assert state.others == {}  # no frozen buffer, no base weight
        assert state.by_name.keys() == state.trained.keys() == shapes.keys()
    # The fit's first client alone (it measures the forward's activations for the default group size), then the rest.
    assert [len(next(iter(state.by_name.values()))) for state in states] == [1, CLIENTS_PER_ROUND - 1]
    for state in states:
        assert all(t.shape[1:] == shapes[n] for n, t in state.by_name.items())


def per_client(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, **kwargs: Any) -> Tensor:
    return torch.stack([
        F.scaled_dot_product_attention(q[i], k[i], v[i], attn_mask=None if mask is None else mask[i], **kwargs)
        for i in range(len(q))
    ])  # fmt: skip


@pytest.mark.parametrize("masked", [False, True], ids=["causal", "per-client-mask"])
def test_folded_attention_equals_the_per_client_kernel_bit_for_bit(masked: bool) -> None:
    torch.manual_seed(0)
    q, k, v = (torch.randn(3, 2, 2, 5, 4, dtype=torch.float64, requires_grad=True) for _ in range(3))
    mask = torch.rand(3, 2, 1, 5, 5) > 0.3 if masked else None
    mask = None if mask is None else mask | torch.eye(5, dtype=torch.bool)  # every query sees one key
    kwargs, mask_dim = {"is_causal": not masked, "scale": 0.7}, 0 if masked else None
    want = per_client(q, k, v, mask, **kwargs)
    want_grads = torch.autograd.grad(want.square().sum(), (q, k, v))
    with warnings.catch_warnings(record=True) as caught, folded_attention():
        warnings.simplefilter("always")
        attend = vmap(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m, **kwargs), in_dims=(0, 0, 0, mask_dim))
        got = attend(q, k, v, mask)
    grads = torch.autograd.grad(got.square().sum(), (q, k, v))
    assert not [w for w in caught if FALLBACK in str(w.message)]
    assert torch.equal(got, want) and all(torch.equal(g, w) for g, w in zip(grads, want_grads))
    assert F.scaled_dot_product_attention is not attention  # restored after the block


def test_folded_attention_under_nested_vmap_with_an_unbatched_key() -> None:
    """The padded step's inner vmap over samples inside the vmap over clients; a key shared by every client."""
    torch.manual_seed(1)
    q, v = torch.randn(3, 4, 1, 2, 6, 4), torch.randn(3, 4, 1, 2, 6, 4)
    k = torch.randn(1, 2, 6, 4)

    def attend(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    want = torch.stack([torch.stack([attend(q[i, j], k, v[i, j]) for j in range(4)]) for i in range(3)])
    with folded_attention():
        got = vmap(vmap(attend, in_dims=(0, None, 0)), in_dims=(0, None, 0))(q, k, v)
    assert torch.equal(got, want)
