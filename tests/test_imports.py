"""Start-up stays cheap: importing fl_lightning loads no heavy optional package of its own."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

#: Imported only when a feature needs them (W&B logging, scikit-learn's digits, plots, studies' plots, LoRACausalLM).
#: Lightning itself imports ``transformers`` where it is installed (torchmetrics' BERTScore); ``peft`` is ours alone.
LAZY = ("wandb", "sklearn", "matplotlib", "dp_accounting", "peft", "transformers")


def test_importing_the_package_and_its_cli_loads_no_optional_dependency() -> None:
    code = (
        "import sys, lightning.pytorch\n"
        f"preloaded = {{m for m in {LAZY!r} if m in sys.modules}}\n"
        "import fl_lightning, fl_lightning.cli, fl_lightning.data, fl_lightning.models, fl_lightning.study\n"
        f"print(sorted(m for m in {LAZY!r} if m in sys.modules and m not in preloaded))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def _run(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()


def test_importing_the_package_imports_none_of_its_features_nor_torch() -> None:
    loaded = _run("import sys, fl_lightning\nprint(sorted(m for m in sys.modules if m.split('.')[0] in {'fl_lightning', 'torch', 'lightning'}))")
    assert loaded == str(["fl_lightning", "fl_lightning._lazy", "fl_lightning._moved", "fl_lightning.utils", "fl_lightning.utils._quiet"])


def test_every_public_name_of_every_package_imports_from_a_fresh_process() -> None:
    code = (
        "import importlib, pkgutil, fl_lightning\n"
        "packages = ['fl_lightning'] + [m.name for m in pkgutil.walk_packages(fl_lightning.__path__, 'fl_lightning.') if m.ispkg]\n"
        "for package in packages:\n"
        "    for name in getattr(importlib.import_module(package), '__all__', []):\n"
        "        exec(f'from {package} import {name}')\n"
        "print(len(fl_lightning.__all__), 'FederatedTrainer' in dir(fl_lightning), fl_lightning.algorithms.FedAvg.__name__)\n"
    )
    assert _run(code) == f"{len(__import__('fl_lightning').__all__)} True FedAvg"


def test_an_unknown_name_is_an_attribute_error() -> None:
    import fl_lightning

    with pytest.raises(AttributeError, match="module 'fl_lightning.data' has no attribute 'Nope'"):
        fl_lightning.data.Nope  # noqa: B018


def test_class_paths_resolve_in_the_cli_in_full_and_by_short_name(tmp_path) -> None:
    quickstart = Path(__file__).resolve().parents[1] / "configs" / "quickstart.yaml"
    code = (
        "from fl_lightning.cli import FederatedCLI\n"
        f"args = ['--config', {str(quickstart)!r}, '--trainer.logger=false', '--model.hidden=[8]', '--trainer.update_bound=NormClip',\n"
        "        '--trainer.update_bound.max_norm=1', '--data.init_args.partitioner=fl_lightning.data.Shards',\n"
        "        '--data.init_args.partitioner.shards_per_client=2']\n"
        "full = FederatedCLI(args=[*args, '--trainer.algorithm=fl_lightning.algorithms.FedProx', '--trainer.algorithm.mu=0.1'], run=False)\n"
        "short = FederatedCLI(args=[*args, '--trainer.algorithm=QFedAvg'], run=False)\n"
        "print(*(type(x).__name__ for x in (full.trainer.algorithm, short.trainer.algorithm, full.trainer.fit_loop.update_bound)))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=tmp_path)
    assert result.stdout.strip().splitlines()[-1] == "FedProx QFedAvg NormClip"
