"""Start-up stays cheap: importing fl_lightning loads no heavy optional package of its own."""

from __future__ import annotations

import subprocess
import sys

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
