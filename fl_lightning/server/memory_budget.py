"""The host-memory budget of per-client state (``FederatedTrainer(client_state_memory=...)``).

Beyond the budget, a :class:`~fl_lightning.server.client_store.ClientStore` spills its least recently used
entries to disk; the numbers a run gives do not depend on it (spilled entries are written and read back
bit for bit), only its peak memory and speed do.
"""

from __future__ import annotations

import os
import re

#: Units of a budget given as text: decimal (kB, MB, GB, TB) and binary (KiB, MiB, GiB, TiB), case-insensitive.
_UNITS = {
    "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}  # fmt: skip
_TEXT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*$", re.IGNORECASE)
#: The default budget, a quarter of the machine's physical memory, resolved by :func:`parse_memory`.
AUTO = "auto"


def parse_memory(value: int | str | None) -> int | None:
    """Bytes of ``value``: an int (bytes, >= 0), text such as ``"2GB"``, ``"512 MiB"`` or ``"1.5gb"``, ``"auto"``
    (a quarter of this machine's physical memory) or ``None`` (unbounded: nothing spills).

    Raises:
        ValueError: naming ``value`` and what is allowed.
    """
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, str):
        if value.strip().lower() == AUTO:
            return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 4
        match = _TEXT.match(value)
        if match and match.group(2).lower() in {*_UNITS, ""}:
            return int(float(match.group(1)) * _UNITS[match.group(2).lower() or "b"])
    raise ValueError(
        f"`client_state_memory` must be a number of bytes >= 0, text such as '2GB' or '512MiB' (units: "
        f"{', '.join(u for u in _UNITS if u != 'b')}, case-insensitive), 'auto' (a quarter of this machine's memory) "
        f"or None (no limit), got {value!r}."
    )
