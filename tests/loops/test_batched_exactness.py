"""The batched executor never differs silently: parameter references it cannot swap are refused at fit start, so are
optimizer settings that differ between a group's clients, and a training_step that draws random numbers is named in a
warning (dropout modules when the fit starts, other random operations as the first step runs), or refused where
batches are padded."""

from __future__ import annotations

import functools
import re
import types
import warnings
from typing import Any

import pytest
import torch
import torch.nn.functional as F
import torchmetrics
from lightning.pytorch.loggers import CSVLogger
from torch import nn

from fl_lightning import FedProx
from fl_lightning.algorithms.shared.algorithm import ClientContext
from fl_lightning.callbacks.federated_callback import FederatedCallback
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


class Holder:
    """A user's object that keeps the parameters it is given."""

    def __init__(self, params: list[nn.Parameter]) -> None:
        self.params = params

    def penalty(self) -> torch.Tensor:
        return sum(p.square().sum() for p in self.params)


class SlottedHolder:
    __slots__ = ("params",)

    def __init__(self, params: list[nn.Parameter]) -> None:
        self.params = params


def _penalty(params: list[nn.Parameter], scale: float) -> torch.Tensor:
    return scale * sum(p.square().sum() for p in params)


def _closure_over(params: list[nn.Parameter]) -> Any:
    return lambda: sum(p.square().sum() for p in params)


#: Where a module keeps its parameters out of functional_call's reach (issue 41's silent 5.8e-3), and the attribute
#: path the refusal names.
HIDDEN: dict[str, tuple[Any, str]] = {
    "simple-namespace": (lambda ps: types.SimpleNamespace(params=ps), r"hidden\.params\[0\]"),
    "user-object": (Holder, r"hidden\.params\[0\]"),
    "slots": (SlottedHolder, r"hidden\.params\[0\]"),
    "closure": (_closure_over, r"hidden\.<closure params>\[0\]"),
    "partial": (lambda ps: functools.partial(_penalty, ps), r"hidden\.args\[0\]\[0\]"),
    "bound-method": (lambda ps: Holder(ps).penalty, r"hidden\.__self__\.params\[0\]"),
}


class KeepsHidden(MLP):
    """Keeps its parameters inside ``keep(parameters)``."""

    def __init__(self, keep: Any) -> None:
        super().__init__(**SIZES)
        self.hidden = keep(list(self.parameters()))


@pytest.mark.parametrize("where", list(HIDDEN))
def test_a_parameter_kept_in_an_object_or_a_closure_is_found(where: str) -> None:
    keep, path = HIDDEN[where]
    found = hidden_parameter_references(KeepsHidden(keep))
    assert len(found) == 4
    assert any(re.fullmatch(rf"KeepsHidden\.{path}", p) for p, _ in found), found


class ClosesOverParameters(MLP):
    """The audit's closure: a penalty over the parameter list it closes over."""

    def __init__(self) -> None:
        super().__init__(**SIZES)
        params = list(self.parameters())
        self.penalty = lambda: sum(p.square().sum() for p in params)

    def training_step(self, batch, batch_idx):
        return super().training_step(batch, batch_idx) + 1e-2 * self.penalty()


def test_a_closure_over_parameters_is_refused_at_fit_start() -> None:
    with pytest.raises(ValueError, match=r"keeps 4 of them elsewhere: ClosesOverParameters\.penalty\.<closure params>\[0\]"):
        fit("batched", ClosesOverParameters)


class KeepsLibraryObjects(MLP):
    """Attributes the scan must not enter or report: a metric, a logger, helpers over copies, plain callables."""

    def __init__(self, log_dir: str) -> None:
        super().__init__(**SIZES)
        self.metric = torchmetrics.classification.MulticlassAccuracy(num_classes=4)
        self.csv = CSVLogger(log_dir)
        self.loss_fn = functools.partial(F.cross_entropy, reduction="mean")
        self.anchor = types.SimpleNamespace(copies=[p.detach().clone() for p in self.parameters()], torch=torch)
        self.scale = lambda loss: loss * 1.0


def test_library_objects_and_copies_are_not_refused(tmp_path) -> None:
    model = KeepsLibraryObjects(str(tmp_path))
    assert hidden_parameter_references(model) == []
    fit("batched", lambda: KeepsLibraryObjects(str(tmp_path)))  # trains: the trainer it references is not entered


class PerClientSetting(FederatedCallback):
    """Sets an optimizer setting from the client's id as it starts (issue 41's silent 0.1 with the learning rate)."""

    def __init__(self, key: str, value: Any) -> None:
        self.key, self.value = key, value

    def on_client_start(self, trainer: Any, pl_module: Any, client: ClientContext) -> None:
        trainer.optimizers[0].param_groups[0][self.key] = self.value(client.client_id)


PER_CLIENT = {
    "sgd-lr": (lambda: MLP(**SIZES), "lr", lambda cid: 0.05 * (1 + cid), r"'lr'\]: client \d+: 0\.\d{1,2}, client \d+: 0\.\d{1,2}\D"),
    "sgd-momentum": (lambda: MLP(**SIZES, momentum=0.5), "momentum", lambda cid: 0.1 * cid, r"'momentum'\]"),
    "adam-betas": (
        lambda: MLP(**{**SIZES, "lr": 0.01}, optimizer="adam"),
        "betas",
        lambda cid: (0.9, 0.99 - 0.001 * cid),
        r"'betas'\]: client \d+: \(0\.9, 0\.9\d+\)",
    ),
}


@pytest.mark.parametrize("setting", list(PER_CLIENT))
def test_optimizer_settings_that_differ_between_a_groups_clients_are_refused(setting: str) -> None:
    model_fn, key, value, named = PER_CLIENT[setting]
    with pytest.raises(ValueError, match=rf"one value of each optimizer setting.*param_groups\[0\]\[{named}.*'lean'"):
        fit("batched", model_fn, callbacks=[PerClientSetting(key, value)])


@pytest.mark.parametrize("value", [lambda cid: 0.05 * (1 + cid), lambda cid: 0.07], ids=["per-client-alone", "shared"])
def test_a_learning_rate_set_at_client_start_equals_lightning_where_a_group_shares_it(value: Any) -> None:
    """Groups of one client (each its own rate), or one rate for every client: nothing differs within a group."""
    kwargs = {"max_batched_clients": 1} if value(0) != value(1) else {}
    batched, _, _ = fit("batched", lambda: MLP(**SIZES), callbacks=[PerClientSetting("lr", value)], **kwargs)
    lightning, _, _ = fit("lightning", lambda: MLP(**SIZES), callbacks=[PerClientSetting("lr", value)])
    assert max_diff(batched.state_dict(), lightning.state_dict()) < TOL


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


class DropoutAndNoise(ModuleDropout):
    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self.net(x + 0.1 * torch.randn_like(x)), y)


RANDOM = r"draws random numbers \({}\)\. .*in distribution only.*For equal weights {}"
#: What each kind of random draw is named by, and the remedy its warning gives.
MODULES = (r"dropout modules in training mode: net\.3", "set the dropout probabilities to 0")
OPERATIONS = ("random operations: {}", "take the random draws out of training_step")


@pytest.mark.parametrize(
    ("model_fn", "named"),
    [
        (ModuleDropout, [MODULES]),
        (lambda: FunctionalDropout(**SIZES), [(OPERATIONS[0].format(r"torch\.nn\.functional\.dropout"), OPERATIONS[1])]),
        (lambda: NoisyInputs(**SIZES), [(OPERATIONS[0].format(r"torch\.randn_like"), OPERATIONS[1])]),
        (DropoutAndNoise, [MODULES, (OPERATIONS[0].format(r"torch\.randn_like"), OPERATIONS[1])]),
    ],
    ids=["nn.Dropout", "F.dropout", "randn_like", "nn.Dropout-and-randn_like"],
)
def test_a_random_training_step_is_named_once(model_fn, named) -> None:
    """A dropout module is named once, and its own F.dropout calls are not named again as random operations."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # Equal batches: padded ones are refused for a step that draws in evaluation mode.
        fit("batched", model_fn, data={"drop_last": True})
    messages = [str(w.message) for w in caught if "draws random numbers" in str(w.message)]
    assert len(messages) == len(named), messages
    for message, (part, remedy) in zip(messages, named):
        assert re.search(RANDOM.format(part, remedy), message), message


class WarningsAtFirstStart(FederatedCallback):
    """Counts the randomness warnings given before the first client's steps."""

    def __init__(self, caught: list[warnings.WarningMessage]) -> None:
        self.caught = caught
        self.before: int | None = None

    def on_client_start(self, trainer: Any, pl_module: Any, client: ClientContext) -> None:
        if self.before is None:
            self.before = sum("draws random numbers" in str(w.message) for w in self.caught)


def test_dropout_modules_are_named_when_the_fit_starts() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = WarningsAtFirstStart(caught)
        fit("batched", ModuleDropout, data={"drop_last": True}, callbacks=[first])
    assert first.before == 1


def test_a_random_step_on_padded_batches_is_refused_for_its_randomness() -> None:
    """Unequal batches need the mean-step check, which two noise draws cannot pass: refused, naming the draws."""
    with pytest.raises(ValueError, match=r"draws random numbers even in evaluation mode \(torch\.randn_like\)") as error:
        fit("batched", lambda: NoisyInputs(**SIZES))
    assert "reduction='mean'" not in str(error.value)  # not refused as a loss that is not a mean


@pytest.mark.parametrize(
    "model_fn", [lambda: ModuleDropout(p=0.0), lambda: MLP(**SIZES)], ids=["dropout-p-0", "deterministic"]
)
def test_a_deterministic_training_step_is_not_warned_about(model_fn) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit("batched", model_fn)
    assert not [w for w in caught if "draws random numbers" in str(w.message)]
