"""Whether a checkpoint file is whole, checked before anything in it is used.

``torch.save`` writes a zip archive whose every member carries a CRC-32 of its bytes, but ``torch.load``
never compares them: a flipped byte in tensor data loads silently (a weight of 3e37), and a flipped byte in
the archive's directory fails deep in ``zipfile`` without the file's name. :func:`integrity_problem` reads
the whole archive once and compares every CRC, so a checkpoint is used only when every byte is the one
written. (A truncated file loses the directory, which is written last, and fails the same check.)
"""

from __future__ import annotations

import os
import zipfile

#: The first bytes of a zip archive (a local file header): what every ``torch.save`` file starts with.
_ZIP_MAGIC = b"PK\x03\x04"


class CheckpointError(ValueError):
    """A checkpoint file is unreadable (truncated, corrupt), foreign, or holds invalid federated state."""


def integrity_problem(path: str | os.PathLike[str]) -> str | None:
    """``None`` when ``path`` is a whole ``torch.save`` archive, else what is wrong with it, in a few words
    on one line (an unreadable directory, the member whose CRC-32 does not match, not a zip archive).

    Raises:
        FileNotFoundError: when there is no file at ``path``.
    """
    try:
        with open(path, "rb") as file:
            head = file.read(len(_ZIP_MAGIC))
    except FileNotFoundError:
        raise
    except OSError as err:
        return f"cannot be opened: {err.strerror or err}"
    if head != _ZIP_MAGIC:
        return "not a zip archive, the format torch.save writes" if head else "the file is empty"
    try:
        with zipfile.ZipFile(path) as archive:
            corrupt = archive.testzip()
    except Exception as err:  # a cut or altered directory fails in many ways (BadZipFile, UnicodeDecodeError, ...)
        return f"its zip directory is unreadable ({type(err).__name__}: {one_line(str(err))})"
    return None if corrupt is None else f"member {corrupt} fails its CRC-32 check"


def one_line(text: str) -> str:
    """``text`` with its line breaks and runs of spaces as single spaces."""
    return " ".join(text.split())
