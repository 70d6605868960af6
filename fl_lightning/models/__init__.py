"""Reference models as LightningModules; bring any LightningModule instead."""

from fl_lightning.models.classifier import ClassificationModule
from fl_lightning.models.reference import CNN, MLP, LogisticRegression

__all__ = ["CNN", "ClassificationModule", "LogisticRegression", "MLP"]
