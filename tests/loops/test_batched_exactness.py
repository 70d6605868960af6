"""The batched executor never differs silently: parameter references it cannot swap are refused at fit start, and a
training_step that draws random numbers (dropout modules, F.dropout, noise) is named in one warning."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fl_lightning import FedProx
from fl_lightning.loops.batched_exactness import hidden_parameter_references
from fl_lightning.models import MLP

from .test_batched_clients import TOL, fit, max_diff

SIZES = {"in_features": 12, "hidden": (16,), "num_classes": 4, "lr": 0.1}


class KeepsParameterList(MLP):
    """An L2 penalty over a parameter list kept from ``__init__`` (the audit's silent 0.13 difference)."""

    def __init__(self) -> None:
        super().__init__(**SIZES)
        self.params_list = list(self.parameters())

    def training_step(self, batch, batch_idx):
        return super().training_step(batch, batch_idx) + 1e-2 * sum(p.square().sum() for p in self.params_list)


class KeepsAliasingAnchor(MLP):
    """A pull towards ``[p.detach() ...]`` taken in ``__init__``: views of the live weights, not a copy."""

    def __init__(self) -> None:
        super().__init__(**SIZES)
        self.anchors = {"all": [p.detach() for p in self.parameters()]}

    def training_step(self, batch, batch_idx):
        pull = sum(((p - a) ** 2).sum() for p, a in zip(self.parameters(), self.anchors["all"]))
        return super().training_step(batch, batch_idx) + 0.5 * pull


class KeepsCopiedAnchor(KeepsAliasingAnchor):
    """The same pull towards a copy of the initial weights: a constant, which batched reads as the others do."""

    def __init__(self) -> None:
        super().__init__()
        self.anchors = {"all": [p.detach().clone() for p in self.parameters()]}


@pytest.mark.parametrize(
    ("model_class", "named"),
    [
        (KeepsParameterList, r"KeepsParameterList\.params_list\[0\] \(aliases net\.1\.weight\)"),
        (KeepsAliasingAnchor, r"KeepsAliasingAnchor\.anchors\['all'\]\[0\] \(aliases net\.1\.weight\)"),
    ],
    ids=["parameter-list", "detached-views"],
)
def test_a_kept_parameter_reference_is_refused_at_fit_start_naming_the_attribute(model_class, named) -> None:
    with pytest.raises(ValueError, match=rf"client_executor='batched' .* keeps 4 of them elsewhere: {named}.*'lean'"):
        fit("batched", model_class)


def test_a_copied_anchor_is_not_a_reference_and_batched_equals_lightning() -> None:
    batched, _, _ = fit("batched", KeepsCopiedAnchor)
    lightning, _, _ = fit("lightning", KeepsCopiedAnchor)
    assert max_diff(batched.state_dict(), lightning.state_dict()) < TOL


def test_the_term_mixins_own_references_are_not_reported() -> None:
    model = MLP(**SIZES)
    model.set_proximal_center({name: p.detach().clone() for name, p in model.named_parameters()}, mu=0.1)
    assert model._proximal_pairs  # the mixin holds the live parameters, which the batched executor rebinds itself
    assert hidden_parameter_references(model) == []
    fit("batched", lambda: MLP(**SIZES), algorithm=lambda: FedProx(mu=0.1))  # trains, no refusal


class ModuleDropout(MLP):
    def __init__(self, p: float = 0.3) -> None:
        super().__init__(**SIZES)
        self.net.insert(3, nn.Dropout(p))


class FunctionalDropout(MLP):
    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self.net(F.dropout(x, 0.2, training=self.training)), y)


class NoisyInputs(MLP):
    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self.net(x + 0.1 * torch.randn_like(x)), y)


@pytest.mark.parametrize(
    ("model_fn", "named"),
    [
        (ModuleDropout, r"\(dropout modules in training mode: net\.3; random operations: torch\.nn\.functional\.dropout\)"),
        (lambda: FunctionalDropout(**SIZES), r"\(random operations: torch\.nn\.functional\.dropout\)"),
        (lambda: NoisyInputs(**SIZES), r"\(random operations: torch\.randn_like\)"),
    ],
    ids=["nn.Dropout", "F.dropout", "randn_like"],
)
def test_a_random_training_step_is_named_once(model_fn, named) -> None:
    with pytest.warns(UserWarning, match=rf"draws random numbers {named}\. .*in distribution only") as caught:
        # Equal batches: the padding's mean-step check would compare two noise draws.
        fit("batched", model_fn, data={"drop_last": True})
    assert sum("draws random numbers" in str(w.message) for w in caught) == 1


@pytest.mark.parametrize(
    "model_fn", [lambda: ModuleDropout(p=0.0), lambda: MLP(**SIZES)], ids=["dropout-p-0", "deterministic"]
)
def test_a_deterministic_training_step_is_not_warned_about(model_fn) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit("batched", model_fn)
    assert not [w for w in caught if "draws random numbers" in str(w.message)]
