"""SQLite store files: URL convention, missing directories, empty files (issue 21)."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest

from prioqueue.store import CorruptStore, SQLiteStore, StoreError, open_store, sqlite_path


def test_sqlite_urls_follow_sqlalchemys_convention() -> None:
    assert sqlite_path("sqlite:///b.db") == "b.db"  # relative, not /b.db
    assert sqlite_path("sqlite:///data/b.db") == "data/b.db"
    assert sqlite_path("sqlite:////var/lib/b.db") == "/var/lib/b.db"  # four slashes: absolute
    assert sqlite_path("sqlite:b.db") == "b.db"
    assert sqlite_path("sqlite:///my%20b.db") == "my b.db"
    for bad in ("sqlite://host/b.db", "sqlite:", "sqlite:///", "postgresql://x"):
        with pytest.raises(ValueError, match="sqlite"):
            sqlite_path(bad)


def test_a_three_slash_url_opens_a_relative_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    store = open_store("sqlite:///b.db")
    try:
        assert store.url == f"sqlite:///{tmp_path / 'b.db'}"
    finally:
        store.close()
    assert (tmp_path / "b.db").exists()
    absolute = open_store(f"sqlite:///{tmp_path / 'abs.db'}")  # sqlite:////tmp/...: absolute
    absolute.close()
    assert (tmp_path / "abs.db").exists()


def test_a_missing_directory_is_refused_with_a_clear_error(tmp_path: Path) -> None:
    missing = tmp_path / "nope" / "b.db"
    with pytest.raises(StoreError, match=r"the directory .*nope does not exist"):
        open_store(f"sqlite:///{missing}")
    assert not missing.parent.exists()


def test_an_empty_file_is_refused_not_started_empty(tmp_path: Path) -> None:
    path = tmp_path / "b.db"
    store = SQLiteStore(path)
    epoch = store.claim()
    store.close()
    assert path.stat().st_size > 0  # a store this class created is never empty
    path.write_bytes(b"")  # truncated (or replaced) by accident
    with pytest.raises(CorruptStore, match=r"empty \(0 bytes\)"):
        SQLiteStore(path)
    assert path.stat().st_size == 0  # nothing written
    assert epoch == 1


def test_a_new_file_is_created_and_reopened(tmp_path: Path) -> None:
    path = tmp_path / "new.db"
    SQLiteStore(path).close()
    again = SQLiteStore(path)
    assert again.recover().last_seq == 0
    again.close()


def test_a_truncated_file_fails_its_integrity_check_at_open(tmp_path: Path) -> None:
    path = tmp_path / "b.db"
    store = SQLiteStore(path)
    from prioqueue.store import Event

    epoch = store.claim()
    args = {"job_id": "j", "member": "m", "payload": "x" * 20_000}
    store.append([Event(seq=i, op="submit", args=args, now=1.0) for i in range(1, 60)], epoch=epoch)
    store.close()
    size = path.stat().st_size
    with path.open("r+b") as f:
        f.truncate(size // 2)
    with pytest.raises(CorruptStore):
        SQLiteStore(path)
    assert not os.path.exists(f"{path}-wal") or os.path.getsize(f"{path}-wal") == 0


def test_sqlite_can_still_open_a_file_sqlite_itself_made_empty(tmp_path: Path) -> None:
    # A database sqlite3 created (header written) but without prioqueue tables opens fine.
    path = tmp_path / "plain.db"
    sqlite3.connect(path).execute("CREATE TABLE other (x)").connection.close()
    store = SQLiteStore(path)
    assert store.recover().last_seq == 0
    store.close()
