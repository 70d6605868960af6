"""The CLI's help as plain text, and the subcommand a command line names."""

from __future__ import annotations

import pytest

from fl_lightning.cli_help import plain_text, requested_subcommand


@pytest.mark.parametrize(
    ("markup", "plain"),
    [
        (":class:`~fl_lightning.data.IID`", "IID"),
        (":class:`datetime.timedelta`", "datetime.timedelta"),
        (":py:meth:`~Trainer.fit` runs", "fit runs"),
        (":math:`\\mu \\|w - w^t\\|^2`", "\\mu \\|w - w^t\\|^2"),
        (":doc:`the guide <docs/guide>`", "the guide"),
        ('``ckpt_path="last"``', 'ckpt_path="last"'),
        ("no markup: a `single` tick stays", "no markup: a `single` tick stays"),
    ],
)
def test_sphinx_markup_becomes_plain_text(markup: str, plain: str) -> None:
    assert plain_text(markup) == plain


NAMES = ["fit", "validate", "test", "predict"]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["fit", "--config", "a.yaml"], "fit"),
        (["--config", "test", "validate"], "validate"),  # a config file called "test"
        (["-c", "x.yaml", "test", "--help"], "test"),
        (["--help"], None),
        (["fitt", "--help"], None),  # a typo: every parser, so the error lists the choices
        ([], None),
    ],
)
def test_the_requested_subcommand(args: list[str], expected: str | None) -> None:
    assert requested_subcommand(args, NAMES) == expected
