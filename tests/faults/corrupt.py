"""Flipping one byte of a ``torch.save`` archive: in a tensor's data, or in the archive's central directory."""

from __future__ import annotations

import struct
import zipfile
from pathlib import Path


def _flip(path: Path, offset: int, mask: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= mask
    path.write_bytes(bytes(data))


def flip_tensor_byte(path: Path) -> None:
    """Flips an exponent bit of the first value of the largest tensor (a float32 weight becomes about 1e38 times
    larger or smaller): what a bad disk sector does, and what ``torch.load`` alone reads back silently."""
    with zipfile.ZipFile(path) as archive:
        member = max((i for i in archive.infolist() if "/data/" in i.filename), key=lambda i: i.file_size)
    with path.open("rb") as file:
        file.seek(member.header_offset + 26)  # the local header's name and extra-field lengths
        name_length, extra_length = struct.unpack("<HH", file.read(4))
    _flip(path, member.header_offset + 30 + name_length + extra_length + 3, 0x40)


def flip_directory_byte(path: Path) -> None:
    """Flips a byte of the first member name in the archive's central directory."""
    with zipfile.ZipFile(path) as archive:
        start = archive.start_dir
    _flip(path, start + 46 + 2, 0x80)


FLIPS = {"tensor-data": flip_tensor_byte, "zip-directory": flip_directory_byte}
