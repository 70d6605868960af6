"""``fl-lightning --help`` as plain text.

The help reuses the classes' docstrings, written in Sphinx's reStructuredText for the docs; a
terminal shows ``:class:`~fl_lightning.FedAvg``` as ``FedAvg`` and ``:math:`\\mu``` as ``\\mu``.
"""

from __future__ import annotations

import re
from argparse import Action
from typing import Any

from jsonargparse import DefaultHelpFormatter
from lightning.pytorch.cli import LightningArgumentParser
from typing_extensions import override

# :role:`text`, :role:`~a.b.Name` (shown as "Name") or :role:`Title <target>` (shown as "Title").
_ROLE = re.compile(r":(?:py:)?[a-z]+:`(~?)([^`<]*?)\s*(?:<[^`>]*>)?`")
_LITERAL = re.compile(r"``([^`]+)``")


def plain_text(text: str) -> str:
    """``text`` without Sphinx roles and literal markup: what the docs render, as a terminal shows it."""
    text = _ROLE.sub(lambda m: m.group(2).rsplit(".", 1)[-1] if m.group(1) else m.group(2), text)
    return _LITERAL.sub(r"\1", text)


class PlainHelpFormatter(DefaultHelpFormatter):
    """jsonargparse's help formatter, with every description, heading and argument help as plain text."""

    @override
    def _expand_help(self, action: Action) -> str:
        return plain_text(super()._expand_help(action))

    @override
    def _format_text(self, text: str) -> str:
        return super()._format_text(plain_text(text))

    @override
    def start_section(self, heading: str | None) -> None:
        # A group's heading is its class's or method's docstring summary.
        super().start_section(plain_text(heading) if heading else heading)


class PlainHelpParser(LightningArgumentParser):
    """LightningCLI's parser, formatting help with :class:`PlainHelpFormatter` by default; also the
    parsers that jsonargparse makes for ``--<key>.help <class>`` (of the parser's own type)."""

    def __init__(self, *args: Any, formatter_class: type[DefaultHelpFormatter] = PlainHelpFormatter, **kwargs: Any) -> None:
        super().__init__(*args, formatter_class=formatter_class, **kwargs)
