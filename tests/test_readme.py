"""The README opens with its two set-up commands: the quickstart, and the test command that ``.ci/run`` runs unchanged."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_readme_opens_with_the_quickstart_and_the_ci_test_command():
    head = (ROOT / "README.md").read_text().split("\n## ", 1)[0]
    quickstart, tests = re.findall(r"```bash\n(.*?)\n```", head, flags=re.S)[:2]
    assert quickstart.endswith("&& pip install -e . && fl-lightning fit --config configs/quickstart.yaml")
    assert tests == (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
