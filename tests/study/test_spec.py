"""The study file: parsing, path resolution, overrides and validation."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from fl_lightning.study.spec import StudySpec, WandbSpec, dump_yaml, expand_dotted, load_study, load_yaml, merge, study_from_dict

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def write(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "studies").mkdir()
    write(tmp_path / "base.yaml", {"trainer": {"max_epochs": 5}})
    write(tmp_path / "studies" / "adam.yaml", {"trainer": {"algorithm": {"class_path": "fl_lightning.FedAvg"}}})
    return tmp_path


def test_a_study_file_resolves_paths_against_itself_and_expands_dotted_overrides(folder):
    study = write(
        folder / "studies" / "s.yaml",
        {
            "name": "s",
            "base": "../base.yaml",
            "overrides": {"trainer.max_epochs": 3},
            "seeds": [0, 1],
            "arms": {
                "fedavg": None,
                "fedprox": {"trainer.algorithm": {"class_path": "fl_lightning.FedProx", "init_args": {"mu": 0.1}}},
                "fedadam": {"config": "adam.yaml", "trainer.algorithm.init_args.server_optimizer": "x"},
            },
            "metrics": ["round/accepted_clients"],
            "wandb": {"project": "p", "tags": ["a"]},
        },
    )
    spec = load_study(study)
    assert spec.base == ((folder / "base.yaml").resolve(),)
    assert spec.overrides == {"trainer": {"max_epochs": 3}}
    assert [arm.name for arm in spec.arms] == ["fedavg", "fedprox", "fedadam"]
    assert spec.arm("fedavg").overrides == {} and spec.arm("fedavg").configs == ()
    assert spec.arm("fedprox").overrides == {
        "trainer": {"algorithm": {"class_path": "fl_lightning.FedProx", "init_args": {"mu": 0.1}}}
    }
    assert spec.arm("fedadam").configs == ((folder / "studies" / "adam.yaml").resolve(),)
    assert spec.arm("fedadam").overrides == {"trainer": {"algorithm": {"init_args": {"server_optimizer": "x"}}}}
    assert spec.metrics == {"round/accepted_clients": "mean"}
    assert spec.wandb == WandbSpec(project="p", tags=("a",))
    assert (spec.seed_keys, spec.workers, spec.plots, spec.target_accuracy) == (
        ("seed_everything", "trainer.seed"),
        1,
        True,
        None,
    )
    assert spec.study_dir == Path("studies") / "s"


def test_class_specs_keep_their_keys_and_dotted_keys_merge():
    assert expand_dotted({"a.b": 1, "a": {"c.d": 2}, "x": {"class_path": "k", "init_args": {"p.q": 3}}}) == {
        "a": {"b": 1, "c": {"d": 2}},
        "x": {"class_path": "k", "init_args": {"p.q": 3}},
    }
    assert merge({"a": {"b": 1, "c": 2}}, {"a": {"c": 3}, "d": 4}) == {"a": {"b": 1, "c": 3}, "d": 4}


def test_values_read_as_the_fit_parser_reads_them_and_written_back_unchanged():
    assert load_yaml("lr: 1e-3\nday: 2024-01-01") == {"lr": 0.001, "day": "2024-01-01"}
    data = {"id": "1e999999", "flag": "yes", "none": "null", "lr": 1e-3, "name": "fedprox", "nested": {"x": "1.5"}}
    assert load_yaml(dump_yaml(data)) == data


def test_options_pick_arms_and_seeds_and_the_fingerprint_follows_the_config(folder):
    spec = study_from_dict(
        {"name": "s", "base": "base.yaml", "seeds": [0, 1], "arms": {"a": {}, "b": {"trainer.seed": 1}}}, root=folder
    )
    narrowed = spec.with_options(arms=["b"], seeds=[3], workers=None)
    assert [a.name for a in narrowed.arms] == ["b"] and narrowed.seeds == (3,) and narrowed.workers == 1
    with pytest.raises(KeyError, match="No arm named 'c'"):
        spec.with_options(arms=["c"])
    a, b = spec.arms
    assert spec.fingerprint(a, 0) == spec.fingerprint(a, 0) != spec.fingerprint(a, 1)
    assert spec.fingerprint(a, 0) != spec.fingerprint(b, 0)
    before = spec.fingerprint(a, 0)
    write(folder / "base.yaml", {"trainer": {"max_epochs": 6}})
    assert spec.fingerprint(a, 0) != before


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"colour": "red"}, "Unknown study key"),
        ({"name": "a b"}, "Study `name`"),
        ({"arms": {}}, "at least one arm"),
        ({"arms": {"a/b": {}}}, "Arm names"),
        ({"seeds": [0, 0]}, "distinct"),
        ({"seeds": [-1]}, "integers >= 0"),
        ({"target_accuracy": "high", "monitor": "val/acc", "mode": "max"}, r"`target_accuracy` must be a finite number.*'high'"),
        ({"target_accuracy": float("nan"), "monitor": "val/acc", "mode": "max"}, r"must be a finite number.*nan"),
        ({"metrics": {"round/x": "median"}}, "reduction must be one of"),
        ({"workers": 0}, "workers"),
        ({"base": "missing.yaml"}, "does not exist"),
        ({"wandb": {"project": "p", "mode": "sometimes"}}, "wandb.mode"),
        ({"seed_keys": []}, "seed_keys"),
        ({"monitor": "val/acc"}, r"`monitor` and `mode` go together, mode one of \['min', 'max'\].*mode=None"),
        ({"monitor": "val/acc", "mode": "up"}, r"mode one of \['min', 'max'\].*mode='up'"),
        ({"mode": "max"}, r"got monitor=None, mode='max'"),
        ({"monitor": "", "mode": "max"}, r"`monitor` must be a logged metric's name, got ''"),
        ({"target_accuracy": 0.8}, r"`target_accuracy: 0.8` needs `monitor`"),
    ],
)
def test_invalid_studies_fail_naming_the_value(folder, change, message):
    data = {"name": "s", "base": "base.yaml", "seeds": [0], "arms": {"a": {}}, **change}
    with pytest.raises(ValueError, match=message):
        study_from_dict(data, root=folder)


def test_a_target_follows_the_mode_a_perplexity_above_one_included(folder):
    data = {"name": "s", "base": "base.yaml", "seeds": [0], "arms": {"a": {}}}
    spec = study_from_dict({**data, "monitor": "val/ppl", "mode": "min", "target_accuracy": 30}, root=folder)
    assert (spec.mode, spec.target_accuracy) == ("min", 30.0)


def test_a_study_needs_name_arms_and_seeds(folder):
    with pytest.raises(ValueError, match="needs `seeds`"):
        study_from_dict({"name": "s", "arms": {"a": {}}}, root=folder)
    with pytest.raises(FileNotFoundError):
        load_study(folder / "nope.yaml")


@pytest.mark.parametrize("path", sorted((CONFIGS / "studies").glob("*.yaml")), ids=lambda p: p.name)
def test_the_example_studies_load(path):
    spec = load_study(path)
    assert isinstance(spec, StudySpec) and len(spec.arms) >= 2 and len(spec.seeds) >= 2
