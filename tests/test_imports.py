"""Start-up stays cheap: importing fl_lightning loads no heavy optional package of its own. The checks that need a
fresh interpreter run in one, once per session (:mod:`tests.fresh_process`)."""

from __future__ import annotations

import pytest


def test_importing_the_package_and_its_cli_loads_no_optional_dependency(fresh_process) -> None:
    assert fresh_process("optional_dependencies") == []


def test_importing_the_package_imports_none_of_its_features_nor_torch(fresh_process) -> None:
    loaded = fresh_process("package_alone")
    assert loaded == ["fl_lightning", "fl_lightning._lazy", "fl_lightning._moved", "fl_lightning.utils", "fl_lightning.utils._quiet"]


def test_every_public_name_of_every_package_imports_from_a_fresh_process(fresh_process) -> None:
    assert fresh_process("public_names") == [len(__import__("fl_lightning").__all__), True, "FedAvg"]


def test_an_unknown_name_is_an_attribute_error() -> None:
    import fl_lightning

    with pytest.raises(AttributeError, match="module 'fl_lightning.data' has no attribute 'Nope'"):
        fl_lightning.data.Nope  # noqa: B018


def test_class_paths_resolve_in_the_cli_in_full_and_by_short_name(fresh_process) -> None:
    assert fresh_process("cli_class_paths") == ["FedProx", "QFedAvg", "NormClip"]
