"""Linear regression as a LightningModule: the model of FedSoft's and IFCA's synthetic experiments."""

from __future__ import annotations

from typing import Any, Literal

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fl_lightning.mixins.mixture_weighted import MixtureWeightedMixin
from fl_lightning.mixins.linear_term import LinearTermMixin
from fl_lightning.mixins.proximal import ProximalMixin
from fl_lightning.utils.checks import check_sizes, non_negative, positive


class _LinearModel(pl.LightningModule):
    """The model and its steps, without the mixins: :class:`LinearRegression` puts them around its
    ``training_step`` (a ``training_step`` defined in the class that lists the mixins would replace theirs)."""

    def __init__(
        self,
        *,
        in_features: int = 10,
        out_features: int = 1,
        bias: bool = False,
        lr: float = 5e-3,
        optimizer: Literal["adam", "sgd"] = "adam",
        momentum: float = 0.0,
    ) -> None:
        super().__init__()
        check_sizes(in_features=in_features, out_features=out_features)
        positive("lr", lr)
        non_negative("momentum", momentum)
        if optimizer not in ("adam", "sgd"):
            raise ValueError(f"`optimizer` must be 'adam' or 'sgd', got {optimizer!r}.")
        self.save_hyperparameters()
        self.lr, self.optimizer_name, self.momentum = lr, optimizer, momentum
        self.net = nn.Linear(in_features, out_features, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        x, y = batch
        return F.mse_loss(self(x), y)

    def sample_metrics(self, batch: tuple[Tensor, Tensor]) -> dict[str, Tensor]:
        """Per-sample squared error (mean over outputs), for loss probes."""
        x, y = batch
        return {"loss": ((self(x) - y) ** 2).mean(dim=-1)}

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", F.mse_loss(self(x), y), batch_size=len(y), prog_bar=True)

    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        x, y = batch
        self.log("test_loss", F.mse_loss(self(x), y), batch_size=len(y))

    def configure_optimizers(self) -> Any:
        if self.optimizer_name == "adam":
            return torch.optim.Adam(self.parameters(), lr=self.lr)
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=self.momentum)


class LinearRegression(LinearTermMixin, ProximalMixin, _LinearModel):
    """:math:`\\hat y = W x (+ b)` trained on the mean squared error (FedSoft's synthetic model is
    ``Linear(10 -> 1)`` without intercept, Adam, lr 5e-3).

    Batches are ``(x, y)`` with ``y`` of shape ``[B, out_features]``. Logs ``train_loss`` and
    ``val_loss`` / ``test_loss`` (MSE) of the server's model; the loop reports the training loss
    as ``round/train_loss`` (no per-step ``self.log``, which costs about as much as a step of so
    small a model). :meth:`sample_metrics` gives each sample's squared error (mean over outputs)
    for loss probes. Weights start from ``nn.Linear``'s default
    initialisation (the paper uses Xavier normal; for ``Linear(10 -> 1)`` both are tiny next to
    the regression coefficients).

    Args:
        in_features: input dimension.
        out_features: output dimension.
        bias: learn an intercept.
        lr: learning rate.
        optimizer: ``"adam"`` (default, as the paper) or ``"sgd"``.
        momentum: SGD momentum.
    """


class MixtureLinearRegression(MixtureWeightedMixin, LinearRegression):
    """:class:`LinearRegression` whose local loss FedEM can weight per sample (:class:`~fl_lightning.FedEM`)."""
