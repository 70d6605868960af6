"""LoRACausalLM: a seeded offline GPT-2 with peft's LoRA adapters; only the adapters train, and they export and
reload exactly. Never touches the network: the models are built from configs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("peft")
pytest.importorskip("transformers")

from fl_lightning import FedAvg  # noqa: E402
from fl_lightning.data import FederatedDataModule, Natural, SyntheticTopicText  # noqa: E402
from fl_lightning.models import LoRACausalLM  # noqa: E402

from ..quiet import quiet_trainer  # noqa: E402

TINY = {"model_type": "gpt2", "vocab_size": 32, "n_positions": 16, "n_embd": 32, "n_layer": 1, "n_head": 2}


def tiny(**kwargs: object) -> LoRACausalLM:
    return LoRACausalLM(config=TINY, r=4, **kwargs)  # type: ignore[arg-type]


def test_exactly_one_of_model_name_and_config() -> None:
    with pytest.raises(ValueError, match="exactly one of model_name .* got model_name=None and config=None"):
        LoRACausalLM()
    with pytest.raises(ValueError, match="got model_name='gpt2' and config="):
        LoRACausalLM(model_name="gpt2", config=TINY)
    with pytest.raises(ValueError, match=r"`r` \(the LoRA rank\) must be an int >= 1, got 0"):
        LoRACausalLM(config=TINY, r=0)
    with pytest.raises(ValueError, match="list of module names, got the string 'c_attn'"):
        tiny(target_modules="c_attn")


def test_seeded_build_is_reproducible_and_leaves_the_global_rng_alone() -> None:
    state = torch.random.get_rng_state()
    a, b = tiny(), tiny()
    assert torch.equal(torch.random.get_rng_state(), state)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    assert not torch.equal(a.model.base_model.model.transformer.wte.weight, tiny(seed=1).model.base_model.model.transformer.wte.weight)


def test_only_the_adapters_train_and_the_optimizer_holds_only_them() -> None:
    module = tiny()
    trainable = {n for n, p in module.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    assert {n.split(".")[-4] for n in trainable} == {"c_attn"}  # peft's GPT-2 default
    optimizer = module.configure_optimizers()
    assert sum(p.numel() for g in optimizer.param_groups for p in g["params"]) == sum(
        p.numel() for p in module.parameters() if p.requires_grad
    )


def test_batches_dict_tuple_and_padding() -> None:
    module = tiny(pad_token_id=0).eval()
    ids = torch.tensor([[5, 6, 7, 0, 0], [8, 9, 10, 11, 12]])
    tuple_loss = module.training_step((ids, torch.zeros(2)), 0)
    labels = ids.masked_fill(ids == 0, -100)
    dict_loss = module.training_step({"input_ids": ids, "attention_mask": (ids != 0).long(), "labels": labels}, 0)
    assert torch.equal(tuple_loss, dict_loss)
    with pytest.raises(ValueError, match=r"A dict batch needs 'input_ids'; it has \['tokens'\]"):
        module.training_step({"tokens": ids}, 0)


def test_adapter_exports_and_reloads_exactly(tmp_path: Path) -> None:
    trained, fresh = tiny(), tiny(seed=1)  # another seed: other adapter initial weights (and another base)
    with torch.no_grad():
        for name, p in trained.named_parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p))
    trained.save_adapter(tmp_path)
    assert (tmp_path / "adapter_model.safetensors").exists() and (tmp_path / "adapter_config.json").exists()
    fresh.load_adapter(tmp_path)
    saved, loaded = trained.adapter_state_dict(), fresh.adapter_state_dict()
    assert saved.keys() == loaded.keys() and all(torch.equal(saved[k], loaded[k]) for k in saved)


def test_federated_lora_keeps_the_base_frozen_under_bf16_mixed() -> None:
    data = FederatedDataModule(
        SyntheticTopicText(num_clients=4, vocab_size=32, seq_len=16, sequences_per_client=10),
        partitioner=Natural(), num_clients=4, val_fraction=0.2, batch_size=4, seed=0,
    )  # fmt: skip
    module = tiny(lr=0.01)
    start = {k: v.clone() for k, v in module.state_dict().items()}
    trainer = quiet_trainer(algorithm=FedAvg(), clients_per_round=2, local_steps=2, max_epochs=1, precision="bf16-mixed")
    trainer.fit(module, datamodule=data)
    end = module.state_dict()
    changed = {k for k in start if not torch.equal(start[k], end[k])}
    assert changed and all("lora_" in k for k in changed)  # the adapters moved, nothing else
    assert all(t.dtype == torch.float32 for t in end.values())
    assert np.isfinite(float(trainer.callback_metrics["val_loss"])) and float(trainer.callback_metrics["val_ppl"]) > 1
