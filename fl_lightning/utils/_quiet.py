"""Narrow filters for third-party output that an fl_lightning user cannot act on.

Each filter matches one message from one module, so every other warning still shows.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

from typing_extensions import override

#: Lightning 2.6's ``_tree_flatten`` builds a ``LeafSpec``, which the torch we require (2.15) deprecates
#: with a ``FutureWarning``; it fires inside Lightning on every fit, and nothing a user writes changes it.
_LEAFSPEC = r"`isinstance\(treespec, LeafSpec\)` is deprecated"

#: Lightning's advice to log epoch-level metrics with ``sync_dist=True`` under DDP, once per metric.
_SYNC_DIST_ADVICE = r"It is recommended to use `self\.log\(.*sync_dist=True\)` when logging on epoch level"

#: Lightning's advertisements for its cloud products, logged (``rank_zero_info``) on every fit.
_TIP_PREFIX = "💡 Tip:"
_RANK_ZERO_LOGGERS = ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero")


def silence_leafspec_warning() -> None:
    """Ignores torch's ``LeafSpec`` deprecation warning when Lightning's pytree helper triggers it."""
    warnings.filterwarnings("ignore", message=_LEAFSPEC, category=FutureWarning, module=r"lightning\.pytorch\.utilities\._pytree")


@contextmanager
def sync_dist_advice_silenced() -> Iterator[None]:
    """Ignores Lightning's ``sync_dist=True`` advice (:data:`_SYNC_DIST_ADVICE`) inside the block.

    For the federated loop's evaluation runs: every rank evaluates the whole validation (or test)
    set, so the advice does not apply. It still shows for metrics a ``training_step`` logs on
    epoch level, which under DDP are each rank's own clients'.
    """
    # Here, not at the top: the package imports this module, and ``import fl_lightning`` does not import Lightning.
    from lightning.pytorch.utilities.warnings import PossibleUserWarning

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_SYNC_DIST_ADVICE, category=PossibleUserWarning)
        yield


class _DropTips(logging.Filter):
    """Drops the records that start with Lightning's tip marker."""

    @override
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(_TIP_PREFIX)


def silence_lightning_tips() -> None:
    """Drops Lightning's "💡 Tip: ..." log lines (the CLI prints what a run needs; nothing else changes)."""
    for name in _RANK_ZERO_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropTips) for f in logger.filters):
            logger.addFilter(_DropTips())
