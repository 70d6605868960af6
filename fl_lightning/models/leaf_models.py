"""LEAF's reference models (Caldas et al. 2018, "LEAF: A Benchmark for Federated Settings", §4).

Exact shapes from the benchmark's code (https://github.com/TalwalkarLab/leaf, ``models/femnist/cnn.py`` and
``models/shakespeare/stacked_lstm.py``). Both are FedProx-ready (:class:`~fl_lightning.ProximalMixin` is
inert until an algorithm sets mu > 0); LEAF trains them with plain SGD.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from fl_lightning.mixins.proximal import ProximalMixin
from fl_lightning.models.classifier import ClassificationModule
from fl_lightning.utils.checks import check_sizes

class FemnistCNN(ProximalMixin, ClassificationModule):
    """LEAF's FEMNIST CNN: two 5×5 "same" convolutions (32, 64 channels, ReLU) each followed by 2×2
    max-pooling, a 2048-unit ReLU layer and a linear output over 62 classes (6,603,710 parameters).

    Takes ``[N, 784]`` rows, as LEAF's JSON stores a 28×28 image, or ``[N, 1, 28, 28]`` images.
    """

    def __init__(self, *, num_classes: int = 62, **kwargs: Any) -> None:
        super().__init__(num_classes=num_classes, **kwargs)
        self.net = nn.Sequential(
            nn.Unflatten(1, (1, 28, 28)),
            nn.Conv2d(1, 32, 5, padding=2),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 5, padding=2),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(7 * 7 * 64, 2048),
            nn.ReLU(),
            nn.Linear(2048, num_classes),
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x.reshape(len(x), -1))


class ShakespeareStackedLSTM(ProximalMixin, ClassificationModule):
    """LEAF's Shakespeare model: an 8-dimensional character embedding, two stacked LSTM layers of 256 units
    and a linear output; the last step's output predicts the character that follows the 80 given.

    Batches are ``(x, y)``: ``x`` the ``[N, seq_len]`` ids of LEAF's 80 letters (``ALL_LETTERS`` in its
    ``models/utils/language_utils.py``), ``y`` the next character's id. PyTorch's LSTM keeps two bias vectors per layer (input and recurrent) where
    TensorFlow's ``BasicLSTMCell`` keeps one: the same function, 2 × 1024 more parameters (819,920
    against LEAF's 817,872).

    Args:
        vocab_size: characters (LEAF: 80).
        embedding_dim: embedding width (LEAF: 8).
        hidden: LSTM units per layer (LEAF: 256).
        num_layers: stacked LSTM layers (LEAF: 2).
    """

    def __init__(
        self, *, vocab_size: int = 80, embedding_dim: int = 8, hidden: int = 256, num_layers: int = 2,
        **kwargs: Any,
    ) -> None:
        super().__init__(num_classes=vocab_size, **kwargs)
        check_sizes(embedding_dim=embedding_dim, hidden=hidden, num_layers=num_layers)
        self.embedding = nn.Embedding(vocab_size, embedding_dim)
        self.lstm = nn.LSTM(embedding_dim, hidden, num_layers=num_layers, batch_first=True)
        self.head = nn.Linear(hidden, vocab_size)
        self.save_hyperparameters(ignore=["lr_scheduler", "num_classes"])  # num_classes is derived: reloadable

    def forward(self, x: Tensor) -> Tensor:
        outputs, _ = self.lstm(self.embedding(x))
        return self.head(outputs[:, -1])
