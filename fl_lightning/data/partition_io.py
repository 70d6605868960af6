"""Reading and writing partitions as JSON, so that runs can share the exact same split."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from fl_lightning.data._checks import check_partition


def save_partition(parts: Sequence[np.ndarray], path: str | os.PathLike[str]) -> None:
    """Writes ``{"num_clients": n, "clients": [[indices], ...]}`` to ``path``.

    The file is written to a temporary name and renamed, so processes that save the same
    partition concurrently (one per rank) never leave a half-written file behind.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"num_clients": len(parts), "clients": [np.asarray(part).tolist() for part in parts]}
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(payload, separators=(",", ":")))
    os.replace(tmp, path)


def load_partition(path: str | os.PathLike[str], *, num_clients: int, num_samples: int) -> list[np.ndarray]:
    """Reads a partition written by :func:`save_partition` and validates it.

    Args:
        path: The JSON file.
        num_clients: The number of clients the file must hold.
        num_samples: Size of the dataset the indices refer to.

    Returns:
        One sorted ``int64`` index array per client.

    Raises:
        ValueError: The file is malformed, has the wrong number of clients, an empty client, an
            index out of range or an index shared by two clients.
    """
    source = f"partition file {str(path)!r}"
    try:
        payload = json.loads(Path(path).read_text())
        clients = payload["clients"]
        declared = payload["num_clients"]
    except (json.JSONDecodeError, KeyError, TypeError) as err:
        raise ValueError(
            f'{source} is not a partition: expected JSON {{"num_clients": n, "clients": [[...], ...]}}.'
        ) from err
    if declared != len(clients):
        raise ValueError(f"{source} declares num_clients={declared} but lists {len(clients)} clients.")
    return check_partition(clients, num_clients=num_clients, num_samples=num_samples, source=source)
