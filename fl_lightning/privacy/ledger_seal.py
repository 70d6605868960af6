"""Authenticating a secure-mode run's privacy ledger in its checkpoints (HMAC-SHA256, RFC 2104).

The ledger decides the ε a run reports; one edited count or noise multiplier in a checkpoint would make a
resumed run under-report it. In secure mode each checkpoint carries an HMAC of the ledger (and of the
settings it was spent at) keyed by a secret that is never in the checkpoint, the run folder or a log, and a
resume refuses a ledger whose tag does not verify.

The per-fit noise secret (:func:`~fl_lightning.privacy.noise.draw_secret`) is drawn afresh by each fit and
never saved, so a resumed fit cannot verify a tag keyed by it; the key is instead the user's ledger key:
``$FL_LIGHTNING_LEDGER_KEY`` (64 hex digits) when set, else ``$XDG_CONFIG_HOME/fl_lightning/ledger.key``
(default ``~/.config``), 32 bytes from the OS's CSPRNG written there on first use, readable by its owner
only. Whoever can read it can forge a tag: keep it off shared storage, and set the variable on every node
of a multi-node run (rank 0's key is broadcast otherwise).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
from pathlib import Path
from typing import Any

import torch

from fl_lightning.utils.saved_state import InvalidStateError

KEY_ENV = "FL_LIGHTNING_LEDGER_KEY"


def ledger_key() -> bytes:
    """The key that seals ledgers (see the module docstring); under ``torch.distributed``, rank 0's.

    Only rank 0 reads (or draws) the key file, so ranks sharing a home folder never race to create it."""
    distributed = torch.distributed.is_available() and torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1
    key = _own_key() if not distributed or torch.distributed.get_rank() == 0 else b""
    if distributed:
        shared = [key]
        torch.distributed.broadcast_object_list(shared, src=0)
        key = shared[0]
    return key


def _own_key() -> bytes:
    if not os.environ.get(KEY_ENV):
        return _key_file()
    try:
        key = bytes.fromhex(os.environ[KEY_ENV])
    except ValueError:
        key = b""
    if len(key) < 32:
        raise ValueError(f"`{KEY_ENV}` must be at least 64 hex digits (32 bytes), got {len(os.environ[KEY_ENV])} characters.")
    return key


def _key_file() -> bytes:
    """The key file's bytes, drawn first if there is none. A new key is written to a private temporary file and
    linked into place, so a process starting at the same moment (another run, another node on a shared home)
    either links its own or reads a complete one, never a half-written file."""
    path = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "fl_lightning" / "ledger.key"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        draft = path.with_name(f".{path.name}.{secrets.token_hex(8)}")
        descriptor = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(descriptor, "wb") as file:
                file.write(secrets.token_bytes(32))
                file.flush()
                os.fsync(file.fileno())
            try:
                os.link(draft, path)
            except FileExistsError:
                pass
        finally:
            draft.unlink()
    key = path.read_bytes()
    if len(key) < 32:
        raise ValueError(f"The ledger key {path} holds {len(key)} bytes, fewer than 32: remove it to draw a new one.")
    return key


def sealed(state: dict[str, Any], key: bytes | None, entries: tuple[str, ...]) -> dict[str, Any]:
    """``state`` with ``spent_seal``, the seal of its ``entries`` (the ledger and the settings it was spent at),
    when there is a ``key`` (secure mode); else ``state`` as it is."""
    return state if key is None else {**state, "spent_seal": seal({name: state.get(name) for name in entries}, key)}


def check_sealed(state: dict[str, Any], key: bytes | None, entries: tuple[str, ...]) -> None:
    """With a ``key`` (secure mode), raises unless ``state``'s ``spent_seal`` is the seal of its ``entries``."""
    if key is not None:
        check_seal({name: state.get(name) for name in entries}, state.get("spent_seal"), key)


def seal(content: Any, key: bytes) -> str:
    """The HMAC-SHA256 of ``content`` (JSON-serialisable: the ledger and its settings), in hex."""
    return hmac.new(key, json.dumps(content, sort_keys=True).encode(), hashlib.sha256).hexdigest()


def check_seal(content: Any, tag: Any, key: bytes) -> None:
    """Raises :class:`~fl_lightning.utils.saved_state.InvalidStateError` unless ``tag`` is ``content``'s seal."""
    if not isinstance(tag, str):
        raise InvalidStateError(
            "`spent_seal` is missing: a secure-mode run's privacy ledger must be authenticated, and this one was written "
            "without secure mode or edited."
        )
    if not hmac.compare_digest(tag, seal(content, key)):
        raise InvalidStateError(
            f"the privacy ledger fails its authentication (HMAC-SHA256 keyed by the ledger key, ${KEY_ENV} or "
            "~/.config/fl_lightning/ledger.key): it was edited, or written with another key."
        )
