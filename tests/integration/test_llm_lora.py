"""Federated LoRA of a causal LM end to end through ``fl-lightning fit`` (``configs/llm/``, ``docs/llm_lora.md``):
the frozen base never moves, the adapters train, and (issue 37) only the adapters go up. Offline: the tiny GPT-2
is built from its config; the hub config is only parsed."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

pytest.importorskip("peft")
pytest.importorskip("transformers")

from fl_lightning.cli import FederatedCLI, main  # noqa: E402
from fl_lightning.models import LoRACausalLM  # noqa: E402

from .config_runs import CONFIGS, run_offline  # noqa: E402

TINY = CONFIGS / "llm" / "lora_tiny_gpt2.yaml"
HUB = CONFIGS / "llm" / "lora_hub_model.yaml"
ROUNDS, CLIENTS = 2, 4


@pytest.fixture(scope="module")
def fitted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FederatedCLI]:
    """The tiny config, 2 rounds of 4 clients x 5 local steps, through the CLI (one run for the module's tests)."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        generator = run_offline(tmp_path_factory.mktemp("lora"), monkeypatch)
        next(generator)
        args = [f"--trainer.max_epochs={ROUNDS}", f"--trainer.clients_per_round={CLIENTS}", "--trainer.local_steps=5"]
        args += ["--trainer.logger=false", "--trainer.enable_progress_bar=false", "--trainer.enable_checkpointing=false"]
        yield FederatedCLI(args=["fit", "--config", str(TINY), *args])
        next(generator, None)


def adapter_bytes(module: LoRACausalLM) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters() if p.requires_grad)


def test_the_frozen_base_is_bit_identical_after_the_fit_and_the_adapters_trained(fitted: FederatedCLI) -> None:
    module = fitted.model
    assert fitted.trainer.current_epoch == ROUNDS
    # Seeded: the module as the CLI built it, before the fit (the CLI adds `_class_path` to the hparams).
    start = LoRACausalLM(**{k: v for k, v in module.hparams.items() if not k.startswith("_")})
    before, after = start.state_dict(), module.state_dict()
    assert before.keys() == after.keys()
    frozen = {n for n, p in module.named_parameters(remove_duplicate=False) if not p.requires_grad}
    assert frozen and frozen <= set(after)
    for name in frozen:
        assert torch.equal(before[name], after[name]), name
    lora_b = [n for n, p in module.named_parameters() if p.requires_grad and "lora_B" in n]
    assert lora_b and all(not torch.equal(before[n], after[n]) for n in lora_b)  # B starts at 0
    val_loss = float(fitted.trainer.callback_metrics["val_loss"])
    assert math.isfinite(val_loss) and val_loss < math.log(64) + 0.05  # about a uniform guess over 64 tokens, or better
    assert np.isclose(float(fitted.trainer.callback_metrics["val_ppl"]), math.exp(val_loss), rtol=1e-4)


def test_each_client_uploads_only_its_adapter(fitted: FederatedCLI) -> None:
    per_client = fitted.trainer.fit_loop.total_upload_bytes / (ROUNDS * CLIENTS)
    assert per_client == adapter_bytes(fitted.model)  # float32 adapters: exactly the adapter, nothing of the base


# Issue 37's "done": the LoRA project uploads its adapter under FedAvg, SCAFFOLD (its Algorithm 1 sends the delta
# and the control-variate change, each adapter-sized) and DPFedAvg, and the base is bit-identical after DPFedAvg
# and FedMRN (whose masked noise would move it).
@pytest.mark.parametrize(
    ("algorithm", "adapters_sent"),
    [
        ({"class_path": "fl_lightning.SCAFFOLD"}, 2),
        ({"class_path": "fl_lightning.DPFedAvg", "init_args": {"noise_multiplier": 1.0, "clip_norm": 0.1}}, 1),
        ({"class_path": "fl_lightning.FedMRN"}, None),
    ],
    ids=["scaffold", "dpfedavg", "fedmrn"],
)
def test_the_algorithms_send_the_adapter_and_leave_the_base(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, algorithm: dict, adapters_sent: int | None
) -> None:
    generator = run_offline(tmp_path, monkeypatch)
    next(generator)
    args = ["--trainer.max_epochs=1", f"--trainer.clients_per_round={CLIENTS}", "--trainer.local_steps=2"]
    args += ["--trainer.logger=false", "--trainer.enable_progress_bar=false", "--trainer.enable_checkpointing=false"]
    args += [f"--trainer.algorithm={yaml.safe_dump(algorithm, default_flow_style=True).strip()}"]
    if algorithm["class_path"].endswith("FedMRN"):
        args += ["--model.class_path=fl_lightning.models.MaskedLoRACausalLM"]
    cli = FederatedCLI(args=["fit", "--config", str(TINY), *args])
    next(generator, None)
    module = cli.model
    start = type(module)(**{k: v for k, v in module.hparams.items() if not k.startswith("_")})
    frozen = [n for n, p in module.named_parameters(remove_duplicate=False) if not p.requires_grad]
    assert frozen and all(torch.equal(start.state_dict()[n], module.state_dict()[n]) for n in frozen)
    per_client = cli.trainer.fit_loop.total_upload_bytes / CLIENTS
    if adapters_sent is None:  # FedMRN: 1-bit masks and a seed per adapter tensor, far below the float32 adapter
        assert per_client < adapter_bytes(module) / 16
    else:
        assert per_client == adapters_sent * adapter_bytes(module)


def test_the_hub_config_parses(capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", str(HUB), "--print_config"])
    assert exit_info.value.code in (0, None)
    config = yaml.safe_load(capsys.readouterr().out)
    model = config["model"]
    assert model["class_path"] == "fl_lightning.models.LoRACausalLM"
    assert model["init_args"]["model_name"] == "HuggingFaceTB/SmolLM2-135M" and model["init_args"]["config"] is None
    assert config["data"]["class_path"].endswith("HuggingFaceDataModule") and config["trainer"]["precision"] == "bf16-mixed"


def test_pre_tokenized_users_in_parquet_train_through_hugging_face_data_module(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hub config's data path, offline: blocks of token ids with a user column in parquet files."""
    datasets = pytest.importorskip("datasets")
    from fl_lightning.data.datasets.hugging_face import HuggingFaceDataModule
    from fl_lightning.data import SyntheticTopicText

    from ..quiet import quiet_trainer

    for name in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"):
        monkeypatch.setenv(name, "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "cache"))
    files = {}
    for split in ("train", "test"):
        text = SyntheticTopicText(num_clients=3, vocab_size=32, seq_len=16, sequences_per_client=10, split=split)
        rows = {"user": [f"user{c}" for c in text.client_ids], "input_ids": text.tensors[0].tolist()}
        files[split] = str(tmp_path / f"{split}.parquet")
        datasets.Dataset.from_dict(rows).to_parquet(files[split])
    data = HuggingFaceDataModule("parquet", data_files=files, user_column="user", columns=["input_ids"], val_fraction=0.2, batch_size=4)
    assert data.client_ids == ["user0", "user1", "user2"]
    module = LoRACausalLM(config={"vocab_size": 32, "n_positions": 16, "n_embd": 32, "n_layer": 1, "n_head": 2}, r=2)
    trainer = quiet_trainer(clients_per_round=2, local_steps=2, max_epochs=1)
    trainer.fit(module, datamodule=data)
    assert math.isfinite(float(trainer.callback_metrics["val_loss"]))
