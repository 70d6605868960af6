"""Reference models as LightningModules; bring any LightningModule instead."""

from fl_lightning.models.causal_lm import LoRACausalLM, MaskedLoRACausalLM
from fl_lightning.models.classifier import ClassificationModule
from fl_lightning.models.flair_resnet import FlairResNet18
from fl_lightning.models.leaf_models import FemnistCNN, ShakespeareStackedLSTM
from fl_lightning.models.next_token import NextTokenModule, ShakespeareLSTM, StackOverflowLSTM
from fl_lightning.models.reference import CNN, MLP, EmnistCNN, LogisticRegression, PflCNN
from fl_lightning.models.regression import LinearRegression, MixtureLinearRegression
from fl_lightning.models.resnet_gn import ResNet18GN
from fl_lightning.models.tag_prediction import RecallAtK, TagLogisticRegression

__all__ = [
    "CNN",
    "ClassificationModule",
    "EmnistCNN",
    "FemnistCNN",
    "FlairResNet18",
    "LinearRegression",
    "LoRACausalLM",
    "MaskedLoRACausalLM",
    "LogisticRegression",
    "MLP",
    "MixtureLinearRegression",
    "NextTokenModule",
    "PflCNN",
    "RecallAtK",
    "ResNet18GN",
    "ShakespeareLSTM",
    "ShakespeareStackedLSTM",
    "StackOverflowLSTM",
    "TagLogisticRegression",
]
