"""Import the user's modules from the folder a command runs in, as ``python -m`` does."""

from __future__ import annotations

import os
import sys


def import_from_working_directory() -> None:
    """Puts the working directory first on ``sys.path`` (once), so ``class_path: my_project.MyModule``
    finds ``./my_project.py`` under a console script, which otherwise only searches its own ``bin/`` folder.

    ``python -m fl_lightning.cli`` puts ``""`` there; the absolute path is the same folder, and stays
    right if a run later changes directory.
    """
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
