"""``python -m fl_lightning.cli``: runs ``main()``."""

from fl_lightning.cli import main

main()
