"""``python -m fl_lightning.study STUDY.yaml``: the same as ``fl-lightning-compare``."""

from fl_lightning.study.cli import main

main()
