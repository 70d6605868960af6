"""Reference models as LightningModules; bring any LightningModule instead."""

from fl_lightning._lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "fl_lightning.models.causal_lm": ("LoRACausalLM", "MaskedLoRACausalLM"),
        "fl_lightning.models.classifier": ("ClassificationModule",),
        "fl_lightning.models.flair_resnet": ("FlairResNet18",),
        "fl_lightning.models.leaf_models": ("FemnistCNN", "ShakespeareStackedLSTM"),
        "fl_lightning.models.next_token": ("NextTokenModule", "ShakespeareLSTM", "StackOverflowLSTM"),
        "fl_lightning.models.reference": ("CNN", "MLP", "EmnistCNN", "LogisticRegression", "PflCNN"),
        "fl_lightning.models.regression": ("LinearRegression", "MixtureLinearRegression"),
        "fl_lightning.models.resnet_gn": ("ResNet18GN",),
        "fl_lightning.models.tag_prediction": ("RecallAtK", "TagLogisticRegression"),
    },
)
