"""The checks that need a fresh interpreter, run one after the other in one (``python -m tests.fresh_process OUT``,
by :func:`tests.conftest.fresh_process`): a start-up costs more than all of them. Their order keeps each as fresh as
it needs to be: what ``import fl_lightning`` loads comes first, the optional packages that the package and its CLI
load next (after Lightning only), the CLI's short class names before anything imports those classes, the moved
modules' warnings before anything imports an old path, and every public name last. ``OUT`` receives a JSON object:
each check's name and its ``value``, or the ``error`` it raised."""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path
from typing import Any

#: Imported only when a feature needs them (W&B logging, scikit-learn's digits, plots, studies' plots, LoRACausalLM).
#: Lightning itself imports ``transformers`` where it is installed (torchmetrics' BERTScore); ``peft`` is ours alone.
LAZY = ("wandb", "sklearn", "matplotlib", "dp_accounting", "peft", "transformers")
QUICKSTART = Path(__file__).resolve().parents[1] / "configs" / "quickstart.yaml"


def package_alone() -> list[str]:
    """The modules of fl_lightning, torch and Lightning that ``import fl_lightning`` loads."""
    import fl_lightning  # noqa: F401

    return sorted(m for m in sys.modules if m.split(".")[0] in {"fl_lightning", "torch", "lightning"})


def optional_dependencies() -> list[str]:
    """The packages of :data:`LAZY` that importing the package, its CLI and its feature packages loads after
    Lightning."""
    import lightning.pytorch  # noqa: F401

    preloaded = {m for m in LAZY if m in sys.modules}
    import fl_lightning.cli, fl_lightning.data, fl_lightning.models, fl_lightning.study  # noqa: E401, F401

    return sorted(m for m in LAZY if m in sys.modules and m not in preloaded)


def cli_class_paths(folder: Path) -> list[str]:
    """The classes the CLI builds from full class paths and from short names, run in ``folder``."""
    import os

    from fl_lightning.cli import FederatedCLI

    os.chdir(folder)
    args = [
        "--config", str(QUICKSTART), "--trainer.logger=false", "--model.hidden=[8]", "--trainer.update_bound=NormClip",
        "--trainer.update_bound.max_norm=1", "--data.init_args.partitioner=fl_lightning.data.Shards",
        "--data.init_args.partitioner.shards_per_client=2",
    ]  # fmt: skip
    full = FederatedCLI(args=[*args, "--trainer.algorithm=fl_lightning.algorithms.FedProx", "--trainer.algorithm.mu=0.1"], run=False)
    short = FederatedCLI(args=[*args, "--trainer.algorithm=QFedAvg"], run=False)
    return [type(x).__name__ for x in (full.trainer.algorithm, short.trainer.algorithm, full.trainer.fit_loop.update_bound)]


def moved_modules() -> dict[str, dict[str, Any]]:
    """For each old path of a moved module: whether it is the moved module, and the warnings of importing it twice
    (the move's only: compiling a module may warn too, an invalid escape in a docstring)."""
    import importlib
    import warnings

    from fl_lightning._moved import MOVED

    warnings.simplefilter("always")
    found = {}
    for old, new in MOVED.items():
        with warnings.catch_warnings(record=True) as caught:
            module = importlib.import_module(old)
            importlib.import_module(old)
        found[old] = {
            "same": module is importlib.import_module(new),
            "warnings": [
                str(w.message) for w in caught if issubclass(w.category, DeprecationWarning) and " moved to " in str(w.message)
            ],
        }
    return found


def public_names() -> list[Any]:
    """Imports every name of every package's ``__all__``: their count, and two spot checks."""
    import importlib
    import pkgutil

    import fl_lightning

    packages = ["fl_lightning"] + [m.name for m in pkgutil.walk_packages(fl_lightning.__path__, "fl_lightning.") if m.ispkg]
    for package in packages:
        for name in getattr(importlib.import_module(package), "__all__", []):
            exec(f"from {package} import {name}")
    return [len(fl_lightning.__all__), "FederatedTrainer" in dir(fl_lightning), fl_lightning.algorithms.FedAvg.__name__]


def main(out: Path) -> None:
    checks = {
        "package_alone": package_alone,
        "optional_dependencies": optional_dependencies,
        "cli_class_paths": lambda: cli_class_paths(out.parent),
        "moved_modules": moved_modules,
        "public_names": public_names,
    }
    results: dict[str, dict[str, Any]] = {}
    for name, check in checks.items():
        try:
            results[name] = {"value": check()}
        except Exception:  # noqa: BLE001 - the check's test fails with it; the later checks still run
            results[name] = {"error": traceback.format_exc()}
    out.write_text(json.dumps(results))


if __name__ == "__main__":
    main(Path(sys.argv[1]).resolve())
