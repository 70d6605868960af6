"""FederatedParameters (issue 37): the default resolution, every kind of pattern, tied aliases, every error, and the
selection given from the CLI as YAML."""

from __future__ import annotations

import csv
import json
import re
import warnings
from pathlib import Path

import pytest
import yaml
from torch import nn

from fl_lightning import FederatedParameters
from fl_lightning.cli import main

from .federated_models import tied

QUICKSTART = str(Path(__file__).resolve().parents[1] / "configs" / "quickstart.yaml")
BN = ("running_mean", "running_var", "num_batches_tracked")


class Net(nn.Module):
    """A trainable stem, a frozen BatchNorm, a BatchNorm without affine parameters, a frozen Linear and a head."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(2, 3)
        self.frozen_norm = nn.BatchNorm1d(3).requires_grad_(False)
        self.plain_norm = nn.BatchNorm1d(3, affine=False)
        self.base = nn.Linear(3, 3).requires_grad_(False)
        self.head = nn.Sequential(nn.Linear(3, 2), nn.LayerNorm(2))


def names(prefix: str, *locals_: str) -> tuple[str, ...]:
    return tuple(f"{prefix}.{n}" for n in locals_)


def test_default_resolution_follows_requires_grad_and_buffers_follow_their_module():
    kinds = FederatedParameters().resolve(Net())
    assert kinds.frozen == (*names("frozen_norm", "weight", "bias", *BN), *names("base", "weight", "bias"))
    # a BatchNorm without affine parameters has no parameters to follow: its statistics are averaged
    assert kinds.shared == (
        *names("stem", "weight", "bias"),
        *names("plain_norm", *BN),
        *names("head.0", "weight", "bias"),
        *names("head.1", "weight", "bias"),
    )
    assert kinds.local == () and dict(kinds.aliases) == {}
    assert kinds.shared_parameters == frozenset(names("stem", "weight", "bias")) | set(names("head.0", "weight", "bias")) | set(
        names("head.1", "weight", "bias")
    )
    assert kinds.describe("stem.weight") == "shared" and kinds.describe("base.bias") == "frozen"
    assert kinds.describe("nothing") == "no tensor of the module"
    summary = kinds.summary(Net().state_dict())
    assert summary == {
        "shared_tensors": 9, "shared_values": 9 + 3 + 3 + 1 + 6 + 2 + 4,
        "frozen_tensors": 7, "frozen_values": 3 + 3 + 3 + 3 + 1 + 9 + 3,
        "local_tensors": 0, "local_values": 0, "tied_names": 0,
    }  # fmt: skip


def test_a_frozen_batch_norm_that_trains_its_statistics_is_still_frozen_unless_selected():
    with pytest.warns(UserWarning, match="do not require grad"):  # its weight and bias: the test below
        kinds = FederatedParameters(local=["frozen_norm"]).resolve(Net())
    assert kinds.local == names("frozen_norm", "weight", "bias", *BN)  # local needs no grad
    kinds = FederatedParameters(shared=["frozen_norm.running_*"]).resolve(Net())
    assert names("frozen_norm", "running_mean", "running_var") == tuple(n for n in kinds.shared if "frozen_norm" in n)
    assert "frozen_norm.num_batches_tracked" in kinds.frozen  # the unselected buffer follows its frozen module


def test_a_local_parameter_that_does_not_require_grad_warns_once_naming_each_and_suggesting_frozen():
    with pytest.warns(UserWarning) as record:
        kinds = FederatedParameters(local=["frozen_norm", "base.weight", "head"]).resolve(Net())
    untrained = [*names("frozen_norm", "weight", "bias"), "base.weight"]  # not its buffers, nor the trained head
    message = (
        f"FederatedParameters selects as local parameters that do not require grad: {untrained}. No client trains "
        "them, so each client's copy stays the initial value, stored per client for nothing. Select them as frozen "
        "(never sent or stored per client), or call `requires_grad_(True)` on them to train them."
    )
    assert [str(w.message) for w in record] == [message]
    assert set(untrained) <= set(kinds.local)  # a warning, not a refusal: the selection holds


def test_trained_local_tensors_buffers_and_an_algorithms_own_patterns_do_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        FederatedParameters(local=["head", "plain_norm", "frozen_norm.running_*"]).resolve(Net())
        # FedBN keeps every BatchNorm tensor local, frozen affine ones included: the user cannot select those frozen.
        FederatedParameters().merged(FederatedParameters(local=["_BatchNorm"]), origin="FedBN").resolve(Net())


@pytest.mark.parametrize(
    ("pattern", "expected"),
    [
        ("*.bias", tuple(f"{m}.bias" for m in ("stem", "frozen_norm", "base", "head.0", "head.1"))),  # a state_dict glob
        ("head.0.weight", names("head.0", "weight")),  # a state_dict name
        ("head", names("head.0", "weight", "bias") + names("head.1", "weight", "bias")),  # a module, all its tensors
        ("head.*", names("head.0", "weight", "bias") + names("head.1", "weight", "bias")),  # a glob of module names
        ("LayerNorm", names("head.1", "weight", "bias")),  # a module class
        ("torch.nn.LayerNorm", names("head.1", "weight", "bias")),  # dotted
        ("BatchNorm1d", names("frozen_norm", "weight", "bias", *BN) + names("plain_norm", *BN)),
        ("torch.nn.BatchNorm1d", names("frozen_norm", "weight", "bias", *BN) + names("plain_norm", *BN)),
        ("_BatchNorm", names("frozen_norm", "weight", "bias", *BN) + names("plain_norm", *BN)),  # a base class
    ],
)
@pytest.mark.filterwarnings("ignore:FederatedParameters selects as local parameters")  # frozen_norm's, base.bias
def test_patterns_select_by_name_glob_module_and_class(pattern, expected):
    assert FederatedParameters(local=[pattern]).resolve(Net()).local == expected


def test_a_tied_tensor_is_one_tensor_under_its_first_name():
    model = tied()
    kinds = FederatedParameters().resolve(model)
    assert kinds.shared == ("embed.weight", "mid.weight", "mid.bias", "head.bias")
    assert dict(kinds.aliases) == {"head.weight": "embed.weight"}
    assert kinds.canonical("head.weight") == "embed.weight" and kinds.canonical("mid.bias") == "mid.bias"
    assert kinds.describe("head.weight") == "an alias of `embed.weight` (shared)"
    assert kinds.summary(model.state_dict())["tied_names"] == 1
    # both names selected alike, or the canonical one alone: the alias follows
    for local in (["embed.weight", "head.weight"], ["embed"], ["*.weight"]):
        kinds = FederatedParameters(local=local).resolve(model)
        assert "embed.weight" in kinds.local and kinds.describe("head.weight") == "an alias of `embed.weight` (local)"


def fedbn_merged() -> FederatedParameters:
    """The user's selection with an algorithm's (as the loop merges FedBN's) whose pattern selects nothing."""
    return FederatedParameters(frozen=["base"]).merged(FederatedParameters(local=["Conv2d"]), origin="FedBN")


#: Per refusal: the selection, the module it resolves and the whole message (literal; ``...`` is left out).
REFUSALS = {
    "a tied alias selected local, its first name shared": (
        lambda: FederatedParameters(local=["head"]),
        tied,
        "`head.weight` is the same tensor as `embed.weight` (tied weights), which is shared: it cannot be local; select "
        "both names as one kind.",
    ),
    "a tied alias selected shared, its first name local": (
        lambda: FederatedParameters(local=["embed"], shared=["head.weight"]),
        tied,
        "`head.weight` is the same tensor as `embed.weight` (tied weights), which is local: it cannot be shared; select "
        "both names as one kind.",
    ),
    "a pattern that selects nothing": (
        lambda: FederatedParameters(frozen=["backbone.*"]),
        Net,
        "FederatedParameters selects frozen tensors by 'backbone.*', which matches no tensor of Net: a pattern matches a "
        "state_dict name, a module name or a module class; the names start ['stem.weight', 'stem.bias', "
        "'frozen_norm.weight', 'frozen_norm.bias'].",
    ),
    "an algorithm's pattern that selects nothing, named as its": (
        fedbn_merged,
        Net,
        "FedBN keeps local tensors by 'Conv2d', which matches no tensor of Net: a pattern matches a state_dict name, a "
        "module name or a module class; the names start ['stem.weight', 'stem.bias', 'frozen_norm.weight', "
        "'frozen_norm.bias'].",
    ),
    "a tensor selected as two kinds": (
        lambda: FederatedParameters(local=["head"], shared=["*.weight"]),
        Net,
        "`head.0.weight` is selected as both shared and local (pattern 'head').",
    ),
    "a frozen tensor that requires grad": (
        lambda: FederatedParameters(frozen=["stem"]),
        Net,
        "`stem.weight` is selected as frozen but requires grad: each client would train it and pass its training on to "
        "the next client. Set `requires_grad_(False)` on it, or select it as local or shared.",
    ),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_a_selection_that_cannot_hold_is_refused_saying_why(case):
    selection, module, message = REFUSALS[case]
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        selection().resolve(module())


def test_an_algorithms_patterns_are_merged_after_the_users():
    assert fedbn_merged().patterns == {"local": ("Conv2d",), "frozen": ("base",), "shared": ()}
    assert fedbn_merged().origins == {"Conv2d": "FedBN"}


@pytest.mark.parametrize(
    ("patterns", "shown"), [("head", "'head'"), (("head", ""), "('head', '')"), (["head", 3], "('head', 3)"), (None, "None"), (3, "3")]
)
def test_patterns_must_be_a_list_of_non_empty_strings(patterns, shown):
    refusal = f"`FederatedParameters(local=...)` takes a list of non-empty patterns, got {shown}."
    with pytest.raises(ValueError, match=f"^{re.escape(refusal)}$"):
        FederatedParameters(local=patterns)


def test_patterns_from_any_iterable_are_read_once():
    assert FederatedParameters(local=(p for p in ["head"])).patterns["local"] == ("head",)


SELECTION = {"class_path": "fl_lightning.FederatedParameters", "init_args": {"local": ["net.3"]}}
#: The quickstart's MLP (64 -> 128 -> 10) with its output layer local.
COUNTS = {"shared_values": 64 * 128 + 128, "shared_tensors": 2, "frozen_values": 0, "local_values": 128 * 10 + 10, "local_tensors": 2}


@pytest.mark.usefixtures("cli_in_tmp_path")
@pytest.mark.parametrize("given", ["flag", "yaml"])
def test_the_cli_takes_a_selection_and_reports_its_counts(tmp_path, capsys, monkeypatch, given):
    monkeypatch.setenv("COLUMNS", "200")  # summary rows on one line each
    args = ["fit", "--config", QUICKSTART, "--trainer.max_epochs", "1", "--trainer.clients_per_round", "2"]
    if given == "flag":
        args += ["--trainer.federated_parameters", json.dumps(SELECTION)]
    else:
        (tmp_path / "local_head.yaml").write_text(yaml.safe_dump({"trainer": {"federated_parameters": SELECTION}}))
        args += ["--config", str(tmp_path / "local_head.yaml")]
    main([*args, "--trainer.enable_progress_bar", "false"])
    out = capsys.readouterr().out
    summary = {line.split("│")[1].strip(): line.split("│")[2].strip() for line in out.splitlines() if line.count("│") == 3}
    assert summary["federated values"] == "shared 8,320 (2 tensors), frozen 0 (0), local 1,290 (2)"
    run_dir = tmp_path / "logs" / "quickstart" / "version_0"
    hparams = yaml.safe_load((run_dir / "hparams.yaml").read_text())
    assert {key: hparams[f"fl/parameters.{key}"] for key in COUNTS} == COUNTS
    assert hparams["fl/federated_parameters"] == "FederatedParameters"
    assert hparams["fl/federated_parameters.local"] == ["net.3"]
    rows = csv.DictReader((run_dir / "metrics.csv").read_text().splitlines())
    assert [float(r["round"]) for r in rows if r.get("round/clients")] == [0.0]
