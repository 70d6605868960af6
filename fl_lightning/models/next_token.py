"""Next-token language models of Adaptive Federated Optimization (Reddi et al. 2021, App. C.3-C.4).

Shapes and initialisation from the authors' code (https://github.com/google-research/federated,
``utils/models/shakespeare_models.py`` and ``stackoverflow_models.py``). Every position predicts the token
after it; the loss skips padding and the accuracy also skips the tokens the authors' metric masks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchmetrics.classification import MulticlassAccuracy

from fl_lightning.mixins.proximal import ProximalMixin
from fl_lightning.models.classifier import ClassificationModule
from fl_lightning.utils.checks import check_sizes

#: Padding id of TFF's tokenisers (token ids start at 1).
PAD = 0


def _keras_lstm_init(embedding: nn.Embedding, lstm: nn.LSTM, dense: Sequence[nn.Linear]) -> None:
    """Keras' initialisers as the reference models set them: embedding U(-0.05, 0.05), LSTM kernel He normal,
    recurrent kernel orthogonal, bias zero but the forget gate's 1 (``unit_forget_bias``), dense Glorot normal."""
    nn.init.uniform_(embedding.weight, -0.05, 0.05)
    hidden = lstm.hidden_size
    for name, param in lstm.named_parameters():
        if name.startswith("weight_ih"):
            nn.init.kaiming_normal_(param, nonlinearity="relu")  # std sqrt(2 / fan_in), Keras' HeNormal (untruncated)
        elif name.startswith("weight_hh"):
            nn.init.orthogonal_(param)
        else:
            nn.init.zeros_(param)
            if name.startswith("bias_ih"):  # PyTorch's gate order is (input, forget, cell, output), as Keras'
                nn.init.ones_(param[hidden : 2 * hidden])
    for layer in dense:
        nn.init.xavier_normal_(layer.weight)
        nn.init.zeros_(layer.bias)


class NextTokenModule(ClassificationModule):
    """Base for per-position next-token models: batches are ``(x, y)`` of ``[N, T]`` token ids, ``y`` the
    tokens that follow ``x``; ``forward`` gives ``[N, T, vocab]`` logits.

    The loss is the mean cross-entropy over the non-padding targets (what Keras computes with the
    embedding's ``mask_zero``); ``val_acc``/``test_acc`` count only targets outside :meth:`uncounted_ids`,
    as the reference metric ``MaskedCategoricalAccuracy(masked_tokens=...)`` does.

    Args:
        num_classes: token ids, special tokens included.
        **kwargs: :class:`~fl_lightning.models.ClassificationModule` arguments (lr, optimizer, ...).
    """

    def uncounted_ids(self) -> list[int]:
        """Target ids the accuracy leaves out: padding, and in subclasses OOV, BOS, EOS."""
        return [PAD]

    def _counted(self, targets: Tensor) -> Tensor:
        return ~torch.isin(targets, torch.tensor(self.uncounted_ids(), device=targets.device))

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        x, y = batch
        return F.cross_entropy(self(x).flatten(0, 1), y.flatten(), ignore_index=PAD)

    def sample_metrics(self, batch: tuple[Tensor, Tensor]) -> dict[str, Tensor]:
        """Per sequence: mean cross-entropy over its non-padding targets and the share of its counted targets
        predicted right (0 where it has none)."""
        x, y = batch
        logits = self(x)
        losses = F.cross_entropy(logits.transpose(1, 2), y, ignore_index=PAD, reduction="none")
        tokens = (y != PAD).sum(1).clamp(min=1)
        counted = self._counted(y)
        correct = ((logits.argmax(-1) == y) & counted).sum(1) / counted.sum(1).clamp(min=1)
        return {"loss": losses.sum(1) / tokens, "correct": correct.float()}

    def _evaluate(self, batch: tuple[Tensor, Tensor], stage: str, accuracy: MulticlassAccuracy) -> None:
        x, y = batch
        logits, targets = self(x).flatten(0, 1), y.flatten()
        counted = self._counted(targets)
        accuracy(logits[counted], targets[counted])
        tokens = targets != PAD
        if tokens.any():  # a batch of padding alone has no loss to average
            # Weighted by tokens, so the epoch's value is the mean over tokens, as the reference reports.
            loss = F.cross_entropy(logits[tokens], targets[tokens])
            self.log(f"{stage}_loss", loss, batch_size=int(tokens.sum()), prog_bar=True)
        self.log(f"{stage}_acc", accuracy, prog_bar=True)


class _EmbeddingLSTM(NextTokenModule):
    """Embedding, LSTM layers, then dense layers applied at every position."""

    def _build(self, vocab_size: int, embedding_dim: int, hidden: int, num_layers: int, widths: Sequence[int]) -> None:
        check_sizes(vocab_size=vocab_size, embedding_dim=embedding_dim, hidden=hidden, num_layers=num_layers)
        self.embedding = nn.Embedding(vocab_size, embedding_dim)
        self.lstm = nn.LSTM(embedding_dim, hidden, num_layers=num_layers, batch_first=True)
        sizes = [hidden, *widths]
        self.dense = nn.ModuleList(nn.Linear(a, b) for a, b in zip(sizes, sizes[1:]))
        _keras_lstm_init(self.embedding, self.lstm, self.dense)

    def forward(self, x: Tensor) -> Tensor:
        out, _ = self.lstm(self.embedding(x))
        for layer in self.dense:
            out = layer(out)  # no activation between them, as the reference's projection
        return out


# ProximalMixin first in each concrete class, so that its training_step wraps NextTokenModule's (FedProx-ready).
class ShakespeareLSTM(ProximalMixin, _EmbeddingLSTM):
    """Reddi et al.'s Shakespeare next-character model (McMahan et al. 2017's): an 8-dimensional embedding,
    two LSTM layers of 256 units and a linear output over TFF's 86 characters plus padding (id 0), OOV,
    BOS and EOS (ids 87-89): 90 ids. Accuracy leaves out padding only, as the authors' metric does.

    PyTorch's LSTM keeps two bias vectors per layer where Keras keeps one: 822,570 parameters, the
    reference's 820,522 plus 2 × 1024.
    """

    def __init__(
        self, *, vocab_size: int = 90, embedding_dim: int = 8, hidden: int = 256, num_layers: int = 2, **kwargs: Any
    ) -> None:
        super().__init__(num_classes=vocab_size, **kwargs)
        self._build(vocab_size, embedding_dim, hidden, num_layers, [vocab_size])
        self.save_hyperparameters(ignore=["lr_scheduler", "num_classes"])  # num_classes is derived: reloadable


class StackOverflowLSTM(ProximalMixin, _EmbeddingLSTM):
    """Reddi et al.'s Stack Overflow next-word model: ids are padding (0), the ``vocab_size`` most frequent
    words (1 .. vocab_size), ``num_oov_buckets`` OOV ids, BOS and EOS; a 96-dimensional embedding, one
    LSTM layer of 670 units, a linear projection to 96 and a linear output over all ids (4,050,748
    parameters in Keras, 4,053,428 here: PyTorch's second LSTM bias adds 4 × 670).

    Accuracy leaves out padding, OOV, BOS and EOS targets (the reference's ``accuracy_no_oov_or_eos``:
    predicting OOV or the end of a sentence is not counted as predicting a word).
    """

    def __init__(
        self,
        *,
        vocab_size: int = 10_000,
        num_oov_buckets: int = 1,
        embedding_dim: int = 96,
        hidden: int = 670,
        **kwargs: Any,
    ) -> None:
        check_sizes(vocab_size=vocab_size, num_oov_buckets=num_oov_buckets)
        extended = vocab_size + num_oov_buckets + 3
        super().__init__(num_classes=extended, **kwargs)
        self.words = vocab_size
        self._build(extended, embedding_dim, hidden, 1, [embedding_dim, extended])
        self.save_hyperparameters(ignore=["lr_scheduler", "num_classes"])  # num_classes is derived: reloadable

    def uncounted_ids(self) -> list[int]:
        return [PAD, *range(self.words + 1, self.num_classes)]  # the OOV buckets, then BOS, then EOS
