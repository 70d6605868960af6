"""The ledger key file is drawn once, even by processes that start together (issue 38's CI failure: two ranks
sharing a home folder raced to create it)."""

from __future__ import annotations

import threading

import pytest

from fl_lightning.privacy import ledger_seal


def test_concurrent_first_uses_share_one_complete_key(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    monkeypatch.delenv(ledger_seal.KEY_ENV, raising=False)
    start, keys, errors = threading.Barrier(8), [], []

    def first_use() -> None:
        start.wait()
        try:
            keys.append(ledger_seal.ledger_key())
        except Exception as error:  # noqa: BLE001 - collected so the assertion below can name it
            errors.append(error)

    threads = [threading.Thread(target=first_use) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert len(set(keys)) == 1 and len(keys[0]) == 32
    assert [path.name for path in (tmp_path / "fl_lightning").iterdir()] == ["ledger.key"]
    assert (tmp_path / "fl_lightning" / "ledger.key").stat().st_mode & 0o777 == 0o600


def test_short_environment_key_is_refused(monkeypatch):
    monkeypatch.setenv(ledger_seal.KEY_ENV, "ab" * 16)
    with pytest.raises(ValueError, match="at least 64 hex digits"):
        ledger_seal.ledger_key()
