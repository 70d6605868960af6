"""Stack Overflow tag logistic regression and its recall@5, against a NumPy reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fl_lightning.models import RecallAtK, TagLogisticRegression

# _evaluate runs outside a Trainer here: Lightning's self.log warns and does nothing; the metric still updates.
pytestmark = pytest.mark.filterwarnings("ignore:You are trying to")


def numpy_recall_at_k(scores: np.ndarray, labels: np.ndarray, k: int) -> float:
    """Keras ``Recall(top_k=k)``: true positives among each row's k best scores over all positives."""
    top = np.argsort(-scores, axis=1)[:, :k]
    return float(np.take_along_axis(labels, top, axis=1).sum() / labels.sum())


def test_parameter_count_is_the_references():
    # stackoverflow_lr_models.create_logistic_model(10000, 500): one dense 10000 -> 500 layer.
    assert sum(p.numel() for p in TagLogisticRegression().parameters()) == (10_000 + 1) * 500


def test_recall_at_5_matches_numpy_across_batches():
    rng = np.random.default_rng(0)
    scores, labels = rng.normal(size=(40, 30)), (rng.random((40, 30)) < 0.1).astype(np.float32)
    metric = RecallAtK(5)
    for part in np.array_split(np.arange(40), 3):
        metric.update(torch.from_numpy(scores[part]), torch.from_numpy(labels[part]))
    assert metric.compute().item() == pytest.approx(numpy_recall_at_k(scores, labels, 5))
    with pytest.raises(ValueError, match="`k` must be an integer >= 1, got 0"):
        RecallAtK(0)


def test_loss_is_the_mean_binary_cross_entropy_and_evaluation_logs_recall():
    torch.manual_seed(0)
    model = TagLogisticRegression(num_words=12, num_tags=7).eval()
    x, y = torch.rand(6, 12), (torch.rand(6, 7) < 0.3).float()
    with torch.no_grad():
        p = torch.sigmoid(model(x)).double()
        loss = model.training_step((x, y), 0)
        model._evaluate((x, y), "val", model.val_acc)
    expected = -(y * p.log() + (1 - y) * (1 - p).log()).mean()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    assert model.val_acc.compute().item() == pytest.approx(numpy_recall_at_k(model(x).detach().numpy(), y.numpy(), 5))
    assert type(model)(**model.hparams).net.weight.shape == (7, 12)
