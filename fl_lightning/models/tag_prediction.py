"""Multi-label tag prediction: Reddi et al. 2021's Stack Overflow logistic regression (App. C.4).

Shape from the authors' code (https://github.com/google-research/federated,
``utils/models/stackoverflow_lr_models.py``): one dense sigmoid layer from a bag of words to the tags.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchmetrics import Metric

from fl_lightning.mixins.proximal import ProximalMixin
from fl_lightning.models.classifier import ClassificationModule
from fl_lightning.utils.checks import check_integer, check_sizes


class RecallAtK(Metric):
    """Micro-averaged recall of the ``k`` highest scores: over all samples, the true labels among each
    sample's top ``k`` divided by all true labels (Keras' ``Recall(top_k=k)``, the paper's "recall@5")."""

    full_state_update = False

    def __init__(self, k: int = 5, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        check_integer("k", k, minimum=1)
        self.k = k
        self.add_state("hits", torch.tensor(0.0), dist_reduce_fx="sum")
        self.add_state("positives", torch.tensor(0.0), dist_reduce_fx="sum")

    def update(self, scores: Tensor, labels: Tensor) -> None:
        top = scores.topk(min(self.k, scores.shape[-1]), dim=-1).indices
        self.hits += labels.gather(-1, top).sum()
        self.positives += labels.sum()

    def compute(self) -> Tensor:
        return self.hits / self.positives.clamp(min=1)


class _TagLogisticRegression(ClassificationModule):
    """The model of :class:`TagLogisticRegression`, without FedProx's term."""

    def __init__(self, *, num_words: int = 10_000, num_tags: int = 500, k: int = 5, **kwargs: Any) -> None:
        super().__init__(num_classes=num_tags, **kwargs)
        check_sizes(num_words=num_words)
        self.net = nn.Linear(num_words, num_tags)
        nn.init.xavier_normal_(self.net.weight)
        nn.init.zeros_(self.net.bias)
        self.k = k
        self.val_acc, self.test_acc = RecallAtK(k), RecallAtK(k)  # type: ignore[assignment]
        self.save_hyperparameters(ignore=["lr_scheduler", "num_classes"])  # num_classes is derived: reloadable

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        x, y = batch
        return F.binary_cross_entropy_with_logits(self(x), y.float())

    def sample_metrics(self, batch: tuple[Tensor, Tensor]) -> dict[str, Tensor]:
        """Per sample: mean binary cross-entropy over the tags, and the share of its tags in its top ``k``."""
        x, y = batch
        logits, labels = self(x), y.float()
        hits = labels.gather(-1, logits.topk(min(self.k, logits.shape[-1]), dim=-1).indices).sum(-1)
        return {
            "loss": F.binary_cross_entropy_with_logits(logits, labels, reduction="none").mean(-1),
            "correct": hits / labels.sum(-1).clamp(min=1),
        }

    def _evaluate(self, batch: tuple[Tensor, Tensor], stage: str, accuracy: Metric) -> None:  # type: ignore[override]
        x, y = batch
        logits = self(x)
        accuracy(logits, y.float())
        self.log(f"{stage}_loss", F.binary_cross_entropy_with_logits(logits, y.float()), batch_size=len(y), prog_bar=True)
        self.log(f"{stage}_recall_at_{self.k}", accuracy, batch_size=len(y), prog_bar=True)


# ProximalMixin in a subclass, so that its training_step wraps the model's own (FedProx-ready).
class TagLogisticRegression(ProximalMixin, _TagLogisticRegression):
    """One linear layer from a ``num_words`` bag of words to ``num_tags`` independent sigmoids (Stack
    Overflow: 10,000 words, 500 tags, 5,000,500 parameters), trained on the mean binary cross-entropy.

    Batches are ``(x, y)``: ``x`` the ``[N, num_words]`` normalised bag of words, ``y`` the ``[N, num_tags]``
    0/1 tags, as :class:`~fl_lightning.data.datasets.tff_stackoverflow_tags.TffStackOverflowTags` builds them.
    Logs ``val_loss``, ``val_recall_at_5`` (and ``test_``).
    Weights start Glorot normal, biases zero, as the reference.

    Args:
        num_words: input vocabulary.
        num_tags: tags predicted.
        k: the recall's cut-off.
    """
