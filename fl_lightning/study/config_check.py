"""``config_error``: parse a run's configs as ``fl-lightning fit`` would, without running it."""

from __future__ import annotations

import io
from collections.abc import Sequence
from contextlib import redirect_stderr, redirect_stdout
from typing import Any

from lightning.pytorch.cli import LightningArgumentParser
from typing_extensions import override

from fl_lightning.cli import FederatedCLI
from fl_lightning.study.runner import error_message


class _ParsedOnly(Exception):
    pass


class _ConfigCheck(FederatedCLI):
    """Parses a config as ``fl-lightning fit`` does, and stops before instantiating anything."""

    @override
    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        self.config = parser.parse_args(args)
        raise _ParsedOnly


def config_error(args: Sequence[str]) -> str | None:
    """The error ``fl-lightning <args>`` would stop with while parsing its configs, or ``None``.

    Catches unknown keys, wrong types and class paths that do not import, in this process and in
    a second, before a run is launched; errors raised by the classes themselves surface in the run.
    """
    output = io.StringIO()
    try:
        with redirect_stderr(output), redirect_stdout(output):
            _ConfigCheck(args=list(args))
    except _ParsedOnly:
        return None
    except SystemExit as exit_:
        return error_message(output.getvalue(), exit_.code if isinstance(exit_.code, int) else 2)
    except Exception as error:  # noqa: BLE001 - any failure to parse is the run's failure, not the study's
        return f"{type(error).__name__}: {error}"
    return None
