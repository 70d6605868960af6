"""A class's settings that the command line drops by naming another class, said in a warning.

``--trainer.algorithm fl_lightning.algorithms.FedBuff`` over a config's FedStaleWeight keeps the init args FedBuff
takes and drops the rest (``variant``, ``tracker``): jsonargparse logs that at debug level only, so the run would
go on without settings the user wrote. The CLI's parsers log to :func:`discarded_init_args_logger`, whose handler
turns that one record into a warning naming the dropped settings and both classes.
"""

from __future__ import annotations

import logging
import warnings

#: The start of jsonargparse's record (``discard_init_args_on_class_path_change``); a test pins it.
_DISCARDED = "Due to class_path change from"


class _WarnDiscarded(logging.Handler):
    """Warns with jsonargparse's record of discarded init args; ignores its other debug records."""

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith(_DISCARDED):
            # Located at the command, not at the logging call inside jsonargparse that carries the record.
            warnings.warn_explicit(
                f"{message} The new class does not take them: set what it takes instead, or remove them from the config.",
                UserWarning,
                filename="fl-lightning",
                lineno=0,
                module=__name__,
            )


def discarded_init_args_logger() -> logging.Logger:
    """The logger the CLI gives its parsers (and so every class-typed argument's action)."""
    logger = logging.getLogger("fl_lightning.cli.jsonargparse")
    logger.setLevel(logging.DEBUG)
    logger.propagate = False  # jsonargparse's other debug records stay out of the user's log
    if not logger.handlers:
        logger.addHandler(_WarnDiscarded())
    return logger
