"""The multi-label image model of pfl-research's FLAIR benchmark (``benchmarks/model/pytorch/cnn.py``,
``multi_label_cnn``, https://github.com/apple/pfl-research), without its ImageNet pre-training.

torchvision's ResNet-18 with every BatchNorm made GroupNorm of ``min(32, channels)`` groups (pfl's
``convert_batchnorm_modules``, what pfl does when not pre-trained), trained on the mean binary
cross-entropy over the labels. Inputs are the data module's ``[0, 1]`` images; as pfl's model it
crops (training: ``RandomResizedCrop(224)`` and a random horizontal flip, drawn once per batch as
torchvision draws them for a batched tensor; evaluation: ``Resize(224)``) and normalises with
ImageNet's channel means and deviations.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchmetrics import Metric
from torchmetrics.classification import MultilabelAccuracy, MultilabelAveragePrecision

from fl_lightning.mixins.proximal import ProximalMixin
from fl_lightning.models.classifier import ClassificationModule

#: ImageNet's channel means and standard deviations (pfl's ``get_channel_mean_stddevs('imagenet')``).
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def batchnorm_to_groupnorm(module: nn.Module) -> nn.Module:
    """``module`` with every ``BatchNorm2d`` replaced by ``GroupNorm(min(32, C), C)`` (in place; returned)."""
    for name, child in module.named_children():
        if isinstance(child, nn.BatchNorm2d):
            setattr(module, name, nn.GroupNorm(min(32, child.num_features), child.num_features, affine=True))
        else:
            batchnorm_to_groupnorm(child)
    return module


class _FlairResNet18(ClassificationModule):
    """The model of :class:`FlairResNet18`, without FedProx's term."""

    def __init__(
        self,
        *,
        num_classes: int = 17,
        image_size: int | None = 224,
        mean: Sequence[float] = IMAGENET_MEAN,
        std: Sequence[float] = IMAGENET_STD,
        **kwargs: Any,
    ) -> None:
        super().__init__(num_classes=num_classes, **kwargs)
        import torchvision
        from torchvision import transforms

        if image_size is not None and image_size < 1:
            raise ValueError(f"`image_size` must be >= 1 or None, got {image_size}.")
        self.net = batchnorm_to_groupnorm(torchvision.models.resnet18(weights=None, num_classes=num_classes))
        normalize = transforms.Normalize(list(mean), list(std))
        resized = [] if image_size is None else [transforms.RandomResizedCrop(image_size)]
        self.train_transform = transforms.Compose([*resized, transforms.RandomHorizontalFlip(), normalize])
        self.eval_transform = transforms.Compose([*([] if image_size is None else [transforms.Resize(image_size)]), normalize])
        self.val_acc = MultilabelAccuracy(num_labels=num_classes, average="micro")  # type: ignore[assignment]
        self.test_acc = MultilabelAccuracy(num_labels=num_classes, average="micro")  # type: ignore[assignment]
        self.val_ap = MultilabelAveragePrecision(num_labels=num_classes, average="micro")
        self.test_ap = MultilabelAveragePrecision(num_labels=num_classes, average="micro")

    def forward(self, x: Tensor) -> Tensor:
        return self.net(self.train_transform(x) if self.training else self.eval_transform(x))

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        x, y = batch
        return F.binary_cross_entropy_with_logits(self(x), y.float())

    def sample_metrics(self, batch: tuple[Tensor, Tensor]) -> dict[str, Tensor]:
        """Per sample: mean binary cross-entropy over the labels, and the share of labels right at 0.5."""
        x, y = batch
        logits, labels = self(x), y.float()
        return {
            "loss": F.binary_cross_entropy_with_logits(logits, labels, reduction="none").mean(-1),
            "correct": ((logits > 0).float() == labels).float().mean(-1),
        }

    def _evaluate(self, batch: tuple[Tensor, Tensor], stage: str, accuracy: Metric) -> None:  # type: ignore[override]
        x, y = batch
        logits = self(x)
        scores, labels = torch.sigmoid(logits), y.long()
        accuracy(scores, labels)
        average_precision = self.val_ap if stage == "val" else self.test_ap
        average_precision(scores, labels)
        self.log(f"{stage}_loss", F.binary_cross_entropy_with_logits(logits, y.float()), batch_size=len(y), prog_bar=True)
        self.log(f"{stage}_acc", accuracy, batch_size=len(y))
        self.log(f"{stage}_micro_ap", average_precision, batch_size=len(y), prog_bar=True)


# ProximalMixin in a subclass, so that its training_step wraps the model's own (FedProx-ready).
class FlairResNet18(ProximalMixin, _FlairResNet18):
    """pfl-research's FLAIR model: ResNet-18 (torchvision's, GroupNorm for BatchNorm), one sigmoid per label,
    trained on the mean binary cross-entropy (11.2 M parameters for 17 labels).

    Batches are ``(x, y)``: ``x`` ``[N, 3, H, W]`` images in ``[0, 1]``, ``y`` the ``[N, num_classes]`` 0/1 label
    rows, as :class:`~fl_lightning.data.datasets.flair.Flair` gives them. Logs ``val_loss`` (pfl's "micro loss"),
    ``val_acc`` (its "micro accuracy": labels right at the 0.5 threshold) and ``val_micro_ap`` (its "micro AP",
    the average precision over all (image, label) pairs), and ``test_`` likewise.

    Args:
        num_classes: labels (17 coarse, 1,628 fine).
        image_size: side of the training crop and of the evaluation resize (pfl: 224); ``None``: neither.
        mean: channel means subtracted after the crop (ImageNet's, as pfl's benchmark).
        std: channel deviations divided by.
    """
