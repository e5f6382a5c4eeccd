"""Large Horde images kept outside the journal rows (private).

A submitted image over ``[horde] inline_max_bytes`` is written here *before* the ``complete``
operation is journaled, and the job's result holds its key (``img_blob``) instead of the
image: the journal and the snapshots stay small. Where it lives follows the store:

* ``sqlite:PATH``: one file per image in the folder ``PATH.blobs/`` beside the database
  (written to a temporary name, fsynced, renamed: a crash leaves no torn image);
* ``postgresql://``: the table ``prioqueue_horde_blobs`` in the store's schema (shared by
  the replicas, so a standby that takes over serves the images);
* ``memory://``: a dict.

Retention: :meth:`Blobs.sweep` deletes every image no kept job record refers to (its record
passed ``result_ttl_seconds`` and was dropped, or its ``complete`` was refused) once it is
older than a grace period (an image being written is never swept). The routes run it at most
every ``sweep_every`` seconds, when a request arrives. Reads of a swept image answer ``""``.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import Collection
from pathlib import Path
from typing import Final

from prioqueue.broker.config import BrokerConfig
from prioqueue.clock import SYSTEM_CLOCK, Clock

__all__ = ["GRACE_SECONDS", "Blobs", "blob_key", "blobs_for"]

GRACE_SECONDS: Final = 300.0
"""How old an unreferenced image must be before a sweep deletes it."""


def blob_key(job_id: str, attempt: int, image: str) -> str:
    """The key of an image a worker submitted for ``job_id`` at ``attempt``."""
    digest = hashlib.sha256(image.encode()).hexdigest()[:32]
    return f"{job_id}.{attempt}.{digest}"


class Blobs:
    """Images by key, in memory (the base of the file and PostgreSQL kinds).

    Args:
        clock: Its wall clock, which stamps puts and times sweeps (default
            :data:`~prioqueue.clock.SYSTEM_CLOCK`).
    """

    def __init__(self, *, clock: Clock = SYSTEM_CLOCK) -> None:
        self.clock = clock
        self._data: dict[str, tuple[float, str]] = {}
        self.swept_at = 0.0

    def sweep_due(self, every: float) -> float | None:
        """The time of a sweep if ``every`` seconds passed since the last, else None.

        A sweep due now is noted as made (at most one sweep per ``every``). O(1).
        """
        now = self.clock.wall()
        if now - self.swept_at < every:
            return None
        self.swept_at = now
        return now

    async def put(self, key: str, image: str) -> None:
        """Keep ``image`` under ``key`` (durably, once this returns)."""
        self._data[key] = (self.clock.wall(), image)

    async def get(self, key: str) -> str | None:
        """The image under ``key``, or None (never kept, or swept)."""
        found = self._data.get(key)
        return None if found is None else found[1]

    async def sweep(self, referenced: Collection[str], now: float) -> int:
        """Delete the images not ``referenced`` and older than the grace; how many."""
        old = [
            k
            for k, (at, _) in self._data.items()
            if k not in referenced and at < now - GRACE_SECONDS
        ]
        for key in old:
            del self._data[key]
        return len(old)


class FileBlobs(Blobs):
    """Images as files in one folder (beside an SQLite store)."""

    def __init__(self, folder: Path, *, clock: Clock = SYSTEM_CLOCK) -> None:
        super().__init__(clock=clock)
        self.folder = folder

    def _write(self, key: str, image: str) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        temporary = self.folder / f".{key}.tmp"
        with temporary.open("w", encoding="ascii") as out:
            out.write(image)
            out.flush()
            os.fsync(out.fileno())
        temporary.replace(self.folder / key)

    async def put(self, key: str, image: str) -> None:
        await asyncio.to_thread(self._write, key, image)

    async def get(self, key: str) -> str | None:
        path = self.folder / key
        try:
            return await asyncio.to_thread(path.read_text, encoding="ascii")
        except FileNotFoundError:
            return None

    def _sweep(self, referenced: Collection[str], now: float) -> int:
        if not self.folder.is_dir():
            return 0
        count = 0
        for path in self.folder.iterdir():
            name = path.name.removeprefix(".").removesuffix(".tmp")
            if name in referenced:
                continue
            try:
                if path.stat().st_mtime < now - GRACE_SECONDS:
                    path.unlink()
                    count += 1
            except FileNotFoundError:  # pragma: no cover - removed meanwhile
                continue
        return count

    async def sweep(self, referenced: Collection[str], now: float) -> int:
        return await asyncio.to_thread(self._sweep, set(referenced), now)


class PostgresBlobs(Blobs):
    """Images as rows of ``prioqueue_horde_blobs`` in the store's schema."""

    def __init__(self, url: str, schema: str | None, *, clock: Clock = SYSTEM_CLOCK) -> None:
        super().__init__(clock=clock)
        self.url = url
        self.table = (
            "prioqueue_horde_blobs" if schema is None else f'"{schema}".prioqueue_horde_blobs'
        )
        self._ready = False

    def _run(self, sql: str, params: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as conn:
            if not self._ready:
                conn.execute(
                    f"CREATE TABLE IF NOT EXISTS {self.table} (key text PRIMARY KEY, "
                    "image text NOT NULL, created_at double precision NOT NULL)"
                )
                self._ready = True
            cursor = conn.execute(sql, params)
            return list(cursor.fetchall()) if cursor.description else []

    async def put(self, key: str, image: str) -> None:
        sql = (
            f"INSERT INTO {self.table} (key, image, created_at) VALUES (%s, %s, %s) "
            "ON CONFLICT (key) DO NOTHING"
        )
        await asyncio.to_thread(self._run, sql, (key, image, self.clock.wall()))

    async def get(self, key: str) -> str | None:
        rows = await asyncio.to_thread(
            self._run, f"SELECT image FROM {self.table} WHERE key = %s", (key,)
        )
        return None if not rows else str(rows[0][0])

    async def sweep(self, referenced: Collection[str], now: float) -> int:
        sql = (
            f"DELETE FROM {self.table} WHERE created_at < %s AND NOT (key = ANY(%s)) RETURNING key"
        )
        rows = await asyncio.to_thread(self._run, sql, (now - GRACE_SECONDS, list(referenced)))
        return len(rows)


def blobs_for(config: BrokerConfig) -> Blobs:
    """The image store that follows the broker's ``store``."""
    store = config.store
    if store.startswith("sqlite:"):
        from prioqueue.store import sqlite_path

        return FileBlobs(Path(f"{sqlite_path(store)}.blobs"))
    if store.startswith(("postgresql://", "postgres://")):
        return PostgresBlobs(store, config.store_schema)
    return Blobs()
