"""The store interface, the same suite on SQLite files and a real PostgreSQL schema."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from prioqueue import SizeOneDispatcher
from prioqueue.store import (
    SCHEMA_VERSION,
    CorruptStore,
    Event,
    Fenced,
    PostgresStore,
    Recovery,
    SchemaVersionError,
    Snapshot,
    SQLiteStore,
    Store,
    StoreError,
    StoreLocked,
    dispatcher_factory,
    open_store,
    replay,
)

from .pg import POSTGRES_URL, need_postgres

MakeStore = Callable[[], Store]


def submit(seq: int, job: str, now: float) -> Event:
    return Event(seq=seq, op="submit", args={"job_id": job, "member": "ann", "now": now}, now=now)


def _refused_after(store: Store, sql: str, message: str, params: tuple[Any, ...] = ()) -> None:
    """Run ``sql`` on the store's tables: recover() then raises CorruptStore saying ``message``."""
    with store._transaction():
        store._execute(sql, params)
    with pytest.raises(CorruptStore, match=message):
        store.recover()


def test_a_new_store_is_empty_and_unclaimed(make_store: MakeStore) -> None:
    store = make_store()
    recovery = store.recover()
    assert recovery == Recovery(snapshot=None, events=(), epoch=0)
    assert recovery.last_seq == 0
    assert recovery.high_water is None
    assert store.epoch() == 0
    assert store.claim() == 1
    assert store.claim() == 2


def test_events_come_back_in_order_with_their_arguments(make_store: MakeStore) -> None:
    store = make_store()
    epoch = store.claim()
    events = [submit(1, "a", 10.0), submit(2, "b", 11.5)]
    store.append(events, epoch=epoch)
    store.append(
        [Event(seq=3, op="set_resident_model", args={"model": "m1"}, now=None)], epoch=epoch
    )
    recovery = store.recover()
    assert recovery.events == (*events, Event(3, "set_resident_model", {"model": "m1"}, None))
    assert recovery.last_seq == 3
    assert recovery.high_water == 11.5


def test_a_snapshot_prunes_the_journal_behind_it(make_store: MakeStore) -> None:
    store = make_store()
    epoch = store.claim()
    store.append([submit(1, "a", 1.0), submit(2, "b", 2.0)], epoch=epoch)
    snap = Snapshot(seq=2, taken_at=2.5, state={"k": [1, 2]})
    store.append([submit(3, "c", 3.0)], epoch=epoch, snapshot=Snapshot(3, 3.0, {"x": 1}))
    store.append([], epoch=epoch, snapshot=Snapshot(3, 3.5, {"x": 2}))  # same seq again
    store.append([submit(4, "d", 4.0)], epoch=epoch)
    recovery = store.recover()
    assert recovery.snapshot == Snapshot(3, 3.5, {"x": 2})
    assert [e.seq for e in recovery.events] == [4]
    assert recovery.last_seq == 4
    assert recovery.high_water == 4.0
    assert snap.seq == 2
    # Pruned rows are gone for good, not just hidden.
    assert store._execute("SELECT count(*) FROM prioqueue_journal")[0][0] == 1
    assert store._execute("SELECT count(*) FROM prioqueue_snapshot")[0][0] == 1


def test_an_append_with_a_stale_epoch_is_refused_and_writes_nothing(
    make_store: MakeStore,
) -> None:
    store = make_store()
    old = store.claim()
    store.append([submit(1, "a", 1.0)], epoch=old)
    new = store.claim()
    with pytest.raises(Fenced, match="another broker took over") as info:
        store.append([submit(2, "b", 2.0)], epoch=old, snapshot=Snapshot(2, 2.0, {}))
    assert (info.value.epoch, info.value.current) == (old, new)
    recovery = store.recover()
    assert [e.seq for e in recovery.events] == [1]
    assert recovery.snapshot is None


def test_a_gap_in_the_journal_is_refused(make_store: MakeStore) -> None:
    store = make_store()
    epoch = store.claim()
    store.append([submit(1, "a", 1.0), submit(2, "b", 2.0), submit(3, "c", 3.0)], epoch=epoch)
    _refused_after(store, "DELETE FROM prioqueue_journal WHERE seq = 2", "gap: event 2 is missing")


def test_a_journal_that_does_not_start_after_its_snapshot_is_refused(
    make_store: MakeStore,
) -> None:
    store = make_store()
    epoch = store.claim()
    store.append([submit(1, "a", 1.0), submit(2, "b", 2.0)], epoch=epoch)
    _refused_after(store, "DELETE FROM prioqueue_journal WHERE seq = 1", "event 1 is missing")


@pytest.mark.parametrize(
    ("bad", "message"),
    [("{not json", "not valid JSON"), ("[1, 2]", "not a JSON object"), ("", "not valid JSON")],
)
def test_bad_json_in_the_journal_is_refused(make_store: MakeStore, bad: str, message: str) -> None:
    store = make_store()
    epoch = store.claim()
    store.append([submit(1, "a", 1.0)], epoch=epoch)
    _refused_after(
        store, "UPDATE prioqueue_journal SET args = %s WHERE seq = 1", message, params=(bad,)
    )


def test_a_bad_snapshot_is_refused(make_store: MakeStore) -> None:
    store = make_store()
    epoch = store.claim()
    store.append([submit(1, "a", 1.0)], epoch=epoch, snapshot=Snapshot(1, 1.0, {"a": 1}))
    _refused_after(
        store,
        "UPDATE prioqueue_snapshot SET state = 'garbage'",
        "snapshot at seq 1 is not valid JSON",
    )


def test_a_bad_event_row_is_refused(make_store: MakeStore) -> None:
    store = make_store()
    epoch = store.claim()
    store.append([submit(1, "a", 1.0)], epoch=epoch)
    _refused_after(
        store, "UPDATE prioqueue_journal SET op = '' WHERE seq = 1", "event 1 is invalid"
    )


def test_a_store_from_a_newer_schema_version_is_refused(make_store: MakeStore) -> None:
    store = make_store()
    with store._transaction():
        store._execute(
            "UPDATE prioqueue_meta SET value = %s WHERE key = 'schema_version'",
            (str(SCHEMA_VERSION + 1),),
        )
    store.close()
    with pytest.raises(SchemaVersionError, match="reads up to version 1") as info:
        make_store()
    assert (info.value.found, info.value.supported) == (SCHEMA_VERSION + 1, SCHEMA_VERSION)


@pytest.mark.parametrize(("value", "message"), [("x", "not a number"), ("0", "not valid")])
def test_a_garbled_schema_version_is_refused(
    make_store: MakeStore, value: str, message: str
) -> None:
    store = make_store()
    with store._transaction():
        store._execute(
            "UPDATE prioqueue_meta SET value = %s WHERE key = 'schema_version'", (value,)
        )
    store.close()
    with pytest.raises(CorruptStore, match=message):
        make_store()


def test_a_closed_store_refuses_calls(make_store: MakeStore) -> None:
    store = make_store()
    store.close()
    store.close()
    assert store.closed
    with pytest.raises(StoreError, match="closed"):
        store.recover()


def test_replay_rebuilds_the_dispatcher(make_store: MakeStore) -> None:
    store = make_store()
    epoch = store.claim()
    live = SizeOneDispatcher()
    live.submit("a", member="ann", now=1.0)
    live.submit("b", member="bob", now=2.0)
    grant = live.dispatch(3.0)
    assert grant is not None
    store.append(
        [
            submit(1, "a", 1.0),
            Event(2, "submit", {"job_id": "b", "member": "bob", "now": 2.0}, 2.0),
            Event(3, "dispatch", {"now": 3.0}, 3.0),
        ],
        epoch=epoch,
    )
    rebuilt = replay(store.recover(), dispatcher_factory(SizeOneDispatcher))
    assert rebuilt.snapshot(now=3.0) == live.snapshot(now=3.0)
    assert rebuilt.running == grant


def test_an_event_that_no_longer_replays_stops_recovery(make_store: MakeStore) -> None:
    store = make_store()
    epoch = store.claim()
    store.append([submit(1, "a", 1.0), submit(2, "a", 2.0)], epoch=epoch)  # duplicate id
    with pytest.raises(CorruptStore, match=r"event 2 \(submit\) does not replay: DuplicateJob"):
        replay(store.recover(), dispatcher_factory(SizeOneDispatcher))


@pytest.mark.parametrize("op", ["_check", "no_such_method", "not-an-identifier", "scorer"])
def test_an_event_naming_no_method_stops_recovery(make_store: MakeStore, op: str) -> None:
    store = make_store()
    store.append([Event(1, op, {}, None)], epoch=store.claim())
    with pytest.raises(CorruptStore, match=r"no method|invalid method|does not replay"):
        replay(store.recover(), dispatcher_factory(SizeOneDispatcher))


def test_a_snapshot_that_does_not_restore_stops_recovery(make_store: MakeStore) -> None:
    store = make_store()
    store.append([], epoch=store.claim(), snapshot=Snapshot(0, 1.0, {"format": "nope"}))
    with pytest.raises(CorruptStore, match="cannot restore the snapshot at 0"):
        replay(store.recover(), dispatcher_factory(SizeOneDispatcher))


def test_dispatcher_factory_needs_a_restore_method() -> None:
    with pytest.raises(TypeError, match="no restore"):
        dispatcher_factory(dict)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"seq": 0, "op": "x", "args": {}}, "seq must be"),
        ({"seq": 1, "op": "", "args": {}}, "op must be"),
        ({"seq": 1, "op": "x", "args": []}, "args must be a mapping"),
        ({"seq": 1, "op": "x", "args": {}, "now": float("nan")}, "now must be"),
    ],
)
def test_events_validate_their_fields(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises((TypeError, ValueError), match=message):
        Event(**kwargs)  # type: ignore[arg-type]


# ---------------------------------------------------------------------- SQLite files


def test_sqlite_uses_wal_and_holds_the_file_exclusively(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    store = SQLiteStore(path)
    assert store._execute("PRAGMA journal_mode")[0][0] == "wal"
    with pytest.raises(StoreLocked, match="another process holds this store"):
        SQLiteStore(path, timeout=0.05)
    store.close()
    SQLiteStore(path).close()


def test_a_file_that_is_not_a_database_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    path.write_bytes(b"this is not a database, just some text that is long enough" * 100)
    with pytest.raises(CorruptStore, match="not a valid prioqueue store"):
        SQLiteStore(path)


def _filled_sqlite(path: Path, events: int) -> None:
    store = SQLiteStore(path)
    epoch = store.claim()
    payload = "x" * 200
    store.append(
        [
            Event(i, "submit", {"job_id": f"j{i}", "member": "ann", "payload": payload}, float(i))
            for i in range(1, events + 1)
        ],
        epoch=epoch,
    )
    store._execute("PRAGMA wal_checkpoint(TRUNCATE)")
    store.close()


@pytest.mark.parametrize("keep", [0.5, 0.9])
def test_a_truncated_sqlite_file_is_refused(tmp_path: Path, keep: float) -> None:
    path = tmp_path / "s.db"
    _filled_sqlite(path, 400)
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.truncate(int(size * keep) // 4096 * 4096)
    with pytest.raises(CorruptStore):
        SQLiteStore(path).recover()


def test_a_sqlite_file_with_damaged_pages_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    _filled_sqlite(path, 400)
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.seek(size // 2)
        f.write(os.urandom(8192))
    with pytest.raises(CorruptStore):
        SQLiteStore(path).recover()


def test_a_sqlite_file_in_a_missing_directory_is_a_store_error(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match=r"directory .* does not exist"):
        SQLiteStore(tmp_path / "missing" / "s.db")


# ---------------------------------------------------------------------- URLs


def test_open_store_reads_sqlite_urls_and_paths(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for url in (f"sqlite:///{tmp_path}/a.db", str(tmp_path / "b.db"), tmp_path / "c.db"):
        store = open_store(url)
        assert isinstance(store, SQLiteStore)
        store.close()
    monkeypatch.chdir(tmp_path)
    store = open_store("sqlite:rel.db")
    assert isinstance(store, SQLiteStore)
    assert Path(store.path).name == "rel.db"
    store.close()
    store = open_store()
    assert store.url == f"sqlite:///{tmp_path / 'prioqueue.db'}"
    store.close()
    assert sorted(p.name for p in tmp_path.glob("*.db")) == [
        "a.db",
        "b.db",
        "c.db",
        "prioqueue.db",
        "rel.db",
    ]


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("mysql://x/y", "unknown store scheme 'mysql'"),
        ("sqlite://host/x.db", "no host"),
        ("", "non-empty"),
    ],
)
def test_open_store_refuses_unknown_urls(url: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        open_store(url)


def test_open_store_refuses_a_schema_for_sqlite(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="PostgreSQL stores only"):
        open_store(tmp_path / "x.db", schema="s")


def test_open_store_reads_postgres_urls(pg_schema: str) -> None:
    for url in (POSTGRES_URL, POSTGRES_URL.replace("postgresql://", "postgres://", 1)):
        store = open_store(url, schema=pg_schema)
        assert isinstance(store, PostgresStore)
        assert store.url.endswith(f"#{pg_schema}")
        store.close()


def test_postgres_refuses_a_bad_schema_name_and_an_unreachable_server() -> None:
    need_postgres()
    with pytest.raises(ValueError, match="lower-case identifier"):
        PostgresStore(POSTGRES_URL, schema="x; DROP TABLE y")
    with pytest.raises(StoreError, match=r"cannot connect") as info:
        PostgresStore("postgresql://postgres:secret@127.0.0.1:1/none")
    assert "secret" not in str(info.value)
    assert "postgres:***@" in str(info.value)


def test_sqlite_synchronous_modes(tmp_path: Path) -> None:
    store = open_store(tmp_path / "n.db", synchronous="normal")
    assert isinstance(store, SQLiteStore)
    assert store._execute("PRAGMA synchronous")[0][0] == 1  # NORMAL
    store.close()
    store = open_store(tmp_path / "f.db")
    assert store._execute("PRAGMA synchronous")[0][0] == 2  # FULL
    store.close()
    with pytest.raises(ValueError, match="'full' or 'normal'"):
        SQLiteStore(tmp_path / "x.db", synchronous="off")
    with pytest.raises(ValueError, match="SQLite stores only"):
        open_store(POSTGRES_URL, synchronous="normal")


def test_postgres_stores_opened_at_once_agree_on_one_schema(pg_schema: str) -> None:
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        stores = list(pool.map(lambda _: PostgresStore(POSTGRES_URL, schema=pg_schema), range(4)))
    assert {s.epoch() for s in stores} == {0}
    for s in stores:
        s.close()


def test_an_append_that_fails_writes_nothing(make_store: MakeStore) -> None:
    store = make_store()
    epoch = store.claim()
    store.append([submit(1, "a", 1.0)], epoch=epoch)
    with pytest.raises(StoreError):
        store.append([submit(2, "b", 2.0), submit(1, "again", 3.0)], epoch=epoch)
    assert [e.seq for e in store.recover().events] == [1]


def test_a_store_is_a_context_manager_with_a_readable_repr(make_store: MakeStore) -> None:
    with make_store() as store:
        assert repr(store).startswith(f"<{type(store).__name__} {store.kind}")
        assert store.kind in ("sqlite", "postgresql")
    assert store.closed


def test_sqlite_refuses_an_empty_path() -> None:
    with pytest.raises(ValueError, match="empty path"):
        SQLiteStore("")


def test_postgres_reports_failed_statements(pg_schema: str) -> None:
    store = PostgresStore(POSTGRES_URL, schema=pg_schema)
    assert store.backend_pid() > 0
    with pytest.raises(StoreError, match="nope"):
        store._execute("SELECT * FROM nope")
    store.close()


def test_a_closed_sqlite_store_is_one_self_contained_file(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    store = SQLiteStore(path)
    store.append([submit(1, "a", 1.0)], epoch=store.claim())
    assert Path(f"{path}-wal").stat().st_size > 0
    store.close()
    assert not Path(f"{path}-wal").exists() or Path(f"{path}-wal").stat().st_size == 0
    copy = tmp_path / "copy.db"
    copy.write_bytes(path.read_bytes())
    with SQLiteStore(copy) as again:
        assert [e.seq for e in again.recover().events] == [1]


def test_the_public_names() -> None:
    import prioqueue.store

    assert set(prioqueue.store.__all__) == {
        "JOURNALED_OPS",
        "SCHEMA_VERSION",
        "SKIPPED_WHEN_EMPTY",
        "CommitFailed",
        "CorruptStore",
        "DurableDispatcher",
        "Elector",
        "Event",
        "Fenced",
        "PostgresStore",
        "Recovery",
        "SQLiteStore",
        "SchemaVersionError",
        "Snapshot",
        "Store",
        "StoreError",
        "StoreFatal",
        "StoreLocked",
        "WallClock",
        "dispatcher_factory",
        "open_store",
        "replay",
        "sqlite_path",
    }
    for name in prioqueue.store.__all__:
        assert getattr(prioqueue.store, name) is not None


def test_the_core_never_imports_the_store() -> None:
    import subprocess
    import sys

    code = (
        "import sys, prioqueue, prioqueue.dispatcher, prioqueue.asyncio\n"
        "assert not any(m.startswith('prioqueue.store') for m in sys.modules), 'imported'\n"
        "assert 'sqlite3' not in sys.modules and 'psycopg' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_append_checks_its_arguments(make_store: MakeStore) -> None:
    store = make_store()
    epoch = store.claim()
    with pytest.raises(TypeError, match="epoch must be an int"):
        store.append([], epoch="1")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="events must be Event values"):
        store.append([{"seq": 1}], epoch=epoch)  # type: ignore[list-item]
    with pytest.raises(TypeError, match="snapshot must be a Snapshot"):
        store.append([], epoch=epoch, snapshot={"seq": 1})  # type: ignore[arg-type]


def test_a_deposed_writer_that_collides_with_its_successor_is_told_it_was_fenced(
    make_store: MakeStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = make_store()
    old = store.claim()
    new = store.claim()
    store.append([submit(1, "new", 1.0)], epoch=new)
    # Skip the early check, as if the takeover came between it and the insert.
    checks: list[str] = []
    real = store._check_epoch

    def late_only(epoch: int, sql: str) -> None:
        checks.append(sql)
        if len(checks) > 1:
            real(epoch, sql)

    monkeypatch.setattr(store, "_check_epoch", late_only)
    # With a snapshot, an append is a transaction of several statements on both backends.
    snap = Snapshot(seq=1, taken_at=2.0, state={"jobs": []})
    with pytest.raises(Fenced) as info:
        store.append([submit(1, "old", 2.0)], epoch=old, snapshot=snap)
    assert isinstance(info.value.__cause__, StoreError)
    # Without one (on PostgreSQL a single statement: fence and insert together), too.
    with pytest.raises(Fenced):
        store.append([submit(1, "old", 2.0)], epoch=old)
    assert [e.args["job_id"] for e in store.recover().events] == ["new"]


def test_a_postgres_append_is_one_fenced_statement(
    pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 30: one statement (one round trip) per append without a snapshot, fence kept."""
    store = PostgresStore(POSTGRES_URL, schema=pg_schema)
    old = store.claim()
    statements: list[str] = []
    real = store._execute

    def counted(sql: str, params: Any = ()) -> list[tuple[Any, ...]]:
        statements.append(sql)
        return real(sql, params)

    monkeypatch.setattr(store, "_execute", counted)
    monkeypatch.setattr(store, "_executemany", None)  # not used by the one statement
    store.append([submit(1, "a", 1.0), submit(2, "b", 1.0)], epoch=old)
    assert len(statements) == 1
    statements.clear()
    monkeypatch.undo()
    new = store.claim()
    monkeypatch.setattr(store, "_execute", counted)
    with pytest.raises(Fenced) as info:
        store.append([submit(3, "late", 2.0)], epoch=old)
    assert (info.value.epoch, info.value.current) == (old, new)
    assert len(statements) == 1  # the fence answered inside the same statement
    monkeypatch.undo()
    store.append([submit(3, "c", 3.0)], epoch=new)
    assert [e.args["job_id"] for e in store.recover().events] == ["a", "b", "c"]
    store.close()
