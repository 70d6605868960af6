"""One TensorBoard hyper-parameter session per fit: the user's and the federated loop's hyper-parameters together.

TensorBoard's HPARAMS tab shows a run's first session only, and ``TensorBoardLogger`` writes one per
``log_hyperparams`` call. A fit makes several: the CLI's ``config`` (:mod:`fl_lightning.cli`), Lightning's
module and datamodule ``hparams``, then the loop's flat ``fl/*`` keys. During a fit
(:func:`one_tensorboard_session`), a ``TensorBoardLogger`` keeps what it is given and the loop's call
(:func:`log_federated_hparams`) writes everything as one session. Other loggers get every call as before.
"""

from __future__ import annotations

from argparse import Namespace
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.loggers import Logger, TensorBoardLogger


class _PendingSession:
    """Stands in for a ``TensorBoardLogger``'s ``log_hyperparams`` (an instance attribute shadows the method):
    keeps the hyper-parameters (and metrics) it is given until :meth:`write`, which logs them all at once."""

    def __init__(self, logger: TensorBoardLogger) -> None:
        self.logger = logger
        self.params: dict[str, Any] = {}
        self.metrics: dict[str, Any] | None = None
        self.step: int | None = None
        logger.log_hyperparams = self  # type: ignore[method-assign]

    def __call__(self, params: Mapping[str, Any] | Namespace | None, metrics: Any = None, step: int | None = None) -> None:
        params = vars(params) if isinstance(params, Namespace) else dict(params or {})
        self.params.update(params)
        # The logger's own record (its hparams.yaml, saved when Lightning first saves the logger) as before.
        self.logger.hparams.update(params)
        if metrics is not None:
            self.metrics = {**(self.metrics or {}), **(metrics if isinstance(metrics, Mapping) else {"hp_metric": metrics})}
            self.step = step

    def write(self, params: Mapping[str, Any] | None = None) -> None:
        """Logs what was kept, and ``params``, as one session; the logger's own method is back from then on."""
        del self.logger.log_hyperparams
        self.logger.log_hyperparams({**self.params, **(params or {})}, self.metrics, self.step)


def _pending(logger: Logger) -> _PendingSession | None:
    session = vars(logger).get("log_hyperparams")
    return session if isinstance(session, _PendingSession) else None


@contextmanager
def one_tensorboard_session(trainer: pl.Trainer) -> Iterator[None]:
    """During a fit, each ``TensorBoardLogger`` of ``trainer`` keeps its hyper-parameters until
    :func:`log_federated_hparams`; if the fit ends before (a set-up error), they are written then."""
    for logger in trainer.loggers:
        if isinstance(logger, TensorBoardLogger) and _pending(logger) is None:
            _PendingSession(logger)
    try:
        yield
    finally:
        for logger in trainer.loggers:
            if (session := _pending(logger)) is not None:
                session.write()


def log_federated_hparams(trainer: pl.Trainer, params: Mapping[str, Any]) -> None:
    """Logs ``params`` to every logger; a ``TensorBoardLogger`` writes them with those it kept, as one session."""
    for logger in trainer.loggers:
        session = _pending(logger)
        if session is not None:
            session.write(params)
        else:
            logger.log_hyperparams(dict(params))
