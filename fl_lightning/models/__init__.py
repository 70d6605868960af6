"""Reference models as LightningModules; bring any LightningModule instead."""

from fl_lightning.models.classifier import ClassificationModule
from fl_lightning.models.reference import CNN, MLP, LogisticRegression, PflCNN
from fl_lightning.models.regression import LinearRegression, MixtureLinearRegression

__all__ = ["CNN", "ClassificationModule", "LinearRegression", "LogisticRegression", "MLP", "MixtureLinearRegression", "PflCNN"]
