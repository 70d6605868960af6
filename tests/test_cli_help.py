"""The CLI's help as plain text."""

from __future__ import annotations

import pytest

from fl_lightning.cli.help import plain_text


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
