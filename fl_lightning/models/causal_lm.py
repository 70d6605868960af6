"""Federated LoRA fine-tuning of a Hugging Face causal language model (the ``llm`` extra).

The base model is a hub checkpoint (``AutoModelForCausalLM.from_pretrained``, Wolf et al. 2020) or
one built from a config (offline, seeded); :func:`peft.get_peft_model` freezes it and adds the
low-rank adapters of LoRA (Hu et al. 2022, arXiv 2106.09685: ``W x + (alpha / r) B A x``, ``B = 0``
at start). Only the adapters train, so only they change: FedAvg over them is the federated LoRA of
FedIT (Zhang et al. 2024, arXiv 2305.05644). ``transformers`` and ``peft`` are imported when a
module is built, never by ``import fl_lightning``. Walkthrough: ``docs/llm_lora.md``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from lightning.pytorch import LightningModule
from torch import Tensor, nn
from torchmetrics.aggregation import MeanMetric

from fl_lightning.mixins.linear_term import LinearTermMixin
from fl_lightning.mixins.masked_noise import MaskedNoiseMixin
from fl_lightning.mixins.proximal import ProximalMixin

if TYPE_CHECKING:
    from peft import PeftModel

#: Label of the positions the loss skips (Hugging Face's convention).
IGNORE_INDEX = -100


def _llm_packages() -> tuple[Any, Any]:
    try:
        import peft
        import transformers
    except ImportError as error:
        raise ImportError(f"LoRACausalLM needs `transformers` and `peft`: pip install 'fl-lightning[llm]' ({error}).") from error
    return transformers, peft


def next_token_loss(logits: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
    """Mean cross-entropy of ``logits[:, t]`` against ``labels[:, t + 1]`` over the targets that are not
    :data:`IGNORE_INDEX`, in float32 (as ``transformers``' ``ForCausalLMLoss``), and the number of those targets."""
    targets = labels[:, 1:]
    loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), targets.flatten(), ignore_index=IGNORE_INDEX)
    return loss, (targets != IGNORE_INDEX).sum()


class LoRACausalLMBase(LightningModule):
    """A causal LM whose LoRA adapters are what trains (and what federated learning exchanges).

    Give exactly one of ``model_name`` (a hub name or a local folder, for ``from_pretrained``) and
    ``config`` (``{"model_type": "gpt2", "n_layer": 2, ...}``: ``AutoConfig.for_model``'s arguments; the
    weights are initialised from ``seed``, so two modules built alike are equal tensor for tensor, and
    so are their adapters' initial weights in either case).

    Batches are ``{"input_ids", "attention_mask"?, "labels"?}`` dicts (Hugging Face's collators), or
    tuples whose first tensor is ``input_ids`` (the rest, such as
    :class:`~fl_lightning.data.SyntheticTopicText`'s topic label, is not read). Without ``labels``,
    the labels are the ids, with ``pad_token_id`` positions masked out of the loss and the attention.
    ``training_step`` returns the next-token loss; ``validation_step``/``test_step`` log
    ``val_loss``/``test_loss`` (mean over target tokens) and ``val_ppl``/``test_ppl`` (its ``exp``).

    Args:
        model_name: ``AutoModelForCausalLM.from_pretrained``'s name or path (downloads unless cached).
        config: ``AutoConfig.for_model`` arguments, ``model_type`` among them (default ``"gpt2"``).
        r: LoRA rank.
        lora_alpha: LoRA scaling numerator (the update is scaled by ``lora_alpha / r``).
        lora_dropout: Dropout on the adapters' input.
        target_modules: Module names to adapt; ``None``: ``peft``'s default for the architecture
            (GPT-2: ``c_attn``; Llama, SmolLM: ``q_proj``, ``v_proj``).
        lr: AdamW's learning rate (over the trainable parameters only).
        weight_decay: AdamW's weight decay.
        pad_token_id: Id whose positions neither attend nor count in the loss (``None``: none).
        seed: Seed of the config-built weights and of the adapters' initialisation.
        model_kwargs: More ``from_pretrained`` arguments (``revision``, ``torch_dtype``, ...).
    """

    def __init__(
        self,
        *,
        model_name: str | None = None,
        config: dict[str, Any] | None = None,
        r: int = 8,
        lora_alpha: float = 16.0,
        lora_dropout: float = 0.0,
        target_modules: Sequence[str] | None = None,
        lr: float = 1e-3,
        weight_decay: float = 0.0,
        pad_token_id: int | None = None,
        seed: int = 0,
        model_kwargs: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        if (model_name is None) == (config is None):
            raise ValueError(
                f"Give exactly one of model_name (a hub model) and config (a model built offline); got "
                f"model_name={model_name!r} and config={config!r}."
            )
        if isinstance(r, bool) or not isinstance(r, int) or r < 1:
            raise ValueError(f"`r` (the LoRA rank) must be an int >= 1, got {r!r}.")
        if not 0 <= lora_dropout < 1:
            raise ValueError(f"`lora_dropout` must lie in [0, 1), got {lora_dropout!r}.")
        if not lr > 0:
            raise ValueError(f"`lr` must be > 0, got {lr!r}.")
        if isinstance(target_modules, str):
            raise ValueError(f"`target_modules` must be a list of module names, got the string {target_modules!r}.")
        self.save_hyperparameters()
        transformers, peft = _llm_packages()
        with torch.random.fork_rng(devices=[]):  # seeded, without moving the caller's global RNG
            torch.manual_seed(seed)
            if model_name is not None:
                base = transformers.AutoModelForCausalLM.from_pretrained(model_name, **(model_kwargs or {}))
            else:
                settings = dict(config or {})
                base_config = transformers.AutoConfig.for_model(settings.pop("model_type", "gpt2"), **settings)
                base = transformers.AutoModelForCausalLM.from_config(base_config)
            lora = peft.LoraConfig(
                task_type="CAUSAL_LM",
                r=r,
                lora_alpha=lora_alpha,
                lora_dropout=lora_dropout,
                target_modules=None if target_modules is None else list(target_modules),
                fan_in_fan_out=base.config.model_type == "gpt2",  # GPT-2's Conv1D stores weights transposed
            )
            self.model: PeftModel = peft.get_peft_model(base, lora)
        self.model.config.use_cache = False  # no key/value cache while training
        # Token-weighted mean NLL per evaluation stage, for the perplexity (exp of the epoch's mean, not a mean of exps).
        self._nll = nn.ModuleDict({stage: MeanMetric() for stage in ("val", "test")})

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        """Logits ``[N, T, vocab]``."""
        return self.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits

    def _inputs(self, batch: Any) -> tuple[Tensor, Tensor | None, Tensor]:
        """``(input_ids, attention_mask, labels)`` of a dict or tuple batch (see the class docstring)."""
        if isinstance(batch, Mapping):
            if "input_ids" not in batch:
                raise ValueError(f"A dict batch needs 'input_ids'; it has {sorted(batch)}.")
            ids, mask, labels = batch["input_ids"], batch.get("attention_mask"), batch.get("labels")
        elif isinstance(batch, Tensor):
            ids, mask, labels = batch, None, None
        elif isinstance(batch, (tuple, list)) and batch and isinstance(batch[0], Tensor):
            ids, mask, labels = batch[0], None, None
        else:
            raise ValueError(f"A batch must be a dict with 'input_ids', a tensor or a tuple of tensors, got {type(batch).__name__}.")
        pad = self.hparams.pad_token_id
        if pad is not None and mask is None:
            mask = (ids != pad).long()
        if labels is None:
            labels = ids if pad is None else ids.masked_fill(ids == pad, IGNORE_INDEX)
        return ids, mask, labels

    def _loss(self, batch: Any) -> tuple[Tensor, Tensor]:
        ids, mask, labels = self._inputs(batch)
        return next_token_loss(self(ids, mask), labels)

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        return self._loss(batch)[0]

    def _evaluate(self, batch: Any, stage: str) -> None:
        loss, tokens = self._loss(batch)
        if tokens:  # a batch of padding alone has no loss to average
            # Weighted by its tokens, so the epoch's value is the mean over tokens.
            self.log(f"{stage}_loss", loss, batch_size=int(tokens), prog_bar=True)
            self._nll[stage].update(loss.detach(), tokens)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self._evaluate(batch, "val")

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self._evaluate(batch, "test")

    def _log_perplexity(self, stage: str) -> None:
        metric = self._nll[stage]
        if metric.update_count:
            self.log(f"{stage}_ppl", torch.exp(metric.compute().clamp(max=80.0)))  # capped: exp(80) means "untrained"
        metric.reset()

    def on_validation_epoch_end(self) -> None:
        self._log_perplexity("val")

    def on_test_epoch_end(self) -> None:
        self._log_perplexity("test")

    def configure_optimizers(self) -> torch.optim.Optimizer:
        trainable = [p for p in self.parameters() if p.requires_grad]
        return torch.optim.AdamW(trainable, lr=self.hparams.lr, weight_decay=self.hparams.weight_decay)

    # ------------------------------------------------------------------------------------------
    # The adapter: what federated training produces
    # ------------------------------------------------------------------------------------------

    def adapter_state_dict(self) -> dict[str, Tensor]:
        """The adapters' tensors as ``peft`` saves them (``get_peft_model_state_dict``)."""
        _, peft = _llm_packages()
        return peft.get_peft_model_state_dict(self.model)

    def save_adapter(self, path: str | os.PathLike[str]) -> None:
        """``peft``'s ``save_pretrained``: ``adapter_config.json`` and ``adapter_model.safetensors`` in ``path``,
        loadable by :meth:`load_adapter` or ``PeftModel.from_pretrained(base, path)``."""
        self.model.save_pretrained(os.fspath(path))

    def load_adapter(self, path: str | os.PathLike[str]) -> None:
        """Loads an adapter saved by :meth:`save_adapter` (or any ``save_pretrained`` of the same LoRA
        settings) into this module's adapters, in place; ``ValueError`` naming the tensors it lacks."""
        _, peft = _llm_packages()
        weights = peft.utils.load_peft_weights(os.fspath(path), device=str(self.device))
        result = peft.set_peft_model_state_dict(self.model, weights)
        missing = [k for k in result.missing_keys if "lora_" in k]
        if missing:
            raise ValueError(f"The adapter in {os.fspath(path)!r} lacks {len(missing)} adapter tensors of this model, e.g. {missing[:3]}.")



class LoRACausalLM(LinearTermMixin, ProximalMixin, LoRACausalLMBase):
    """:class:`LoRACausalLMBase` with the client terms FedProx, SCAFFOLD and FedDyn set (over the adapters: the
    shared tensors); with FedAvg the terms are off and it trains as the base does."""


class MaskedLoRACausalLM(MaskedNoiseMixin, LoRACausalLMBase):
    """:class:`LoRACausalLMBase` for :class:`~fl_lightning.FedMRN`: the adapters' weights are masked (the default
    maskable set takes trainable weights only, so the frozen base is never masked)."""
