"""Durability for a dispatcher: a journal of its calls, snapshots, SQLite and PostgreSQL stores.

The core is deterministic: the same calls with the same ``now`` give the same state. So a
dispatcher is made durable by journaling every state-changing call before answering it,
snapshotting now and then, and recovering by restoring the latest snapshot and replaying the
journal after it (the LMAX and slurmctld design). See docs/durability.md for the contract.

* :func:`open_store` makes a :class:`Store` from a URL: ``sqlite:///relative.db`` or
  ``sqlite:////absolute/path.db`` (SQLAlchemy's convention; the default backend; a plain path
  works too) or ``postgresql://user@host/db`` (the ``postgres``
  extra).
* :class:`DurableDispatcher` wraps a dispatcher: group commit on asyncio, crash-only failure.
* :class:`Elector` elects one leader among several brokers on one PostgreSQL database.
* :class:`WallClock` is the clock that never goes backwards across restarts.

What is journaled is declared where it is defined: the methods an object's class marks
``@journaled`` (``prioqueue._journaled``). The store journals and replays those, for any
object, and knows no class by name; ``JOURNALED_OPS`` and ``SKIPPED_WHEN_EMPTY`` are derived
from the core dispatchers' declarations, for reference.

This package is an adapter: the core never imports it.
"""

from __future__ import annotations

import os
from urllib.parse import unquote, urlsplit

from prioqueue.dispatcher import SizeOneDispatcher
from prioqueue.fleet import FleetDispatcher
from prioqueue.store._journal import declared_ops, dispatcher_factory, replay
from prioqueue.store.base import SCHEMA_VERSION, Event, Recovery, Snapshot, Store, default_path
from prioqueue.store.clock import WallClock
from prioqueue.store.durable import DurableDispatcher
from prioqueue.store.errors import (
    CommitFailed,
    CorruptStore,
    Fenced,
    SchemaVersionError,
    StoreError,
    StoreFatal,
    StoreLocked,
)
from prioqueue.store.leader import Elector
from prioqueue.store.postgres import PostgresStore
from prioqueue.store.sqlite import SQLiteStore

__all__ = [
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
]

_CORE = (declared_ops(SizeOneDispatcher), declared_ops(FleetDispatcher))

JOURNALED_OPS: frozenset[str] = frozenset().union(*(ops for ops, _ in _CORE))
"""The operations the core's dispatchers declare ``@journaled``, for reference: derived.

The store journals, for each object, what its own class declares (any object, by no name):
this is the union of ``SizeOneDispatcher``'s and ``FleetDispatcher``'s declarations
(``submit``, ``dispatch``, ``pop``, ``complete``, ``fail``, ``cancel``, ``expire``, ``join``,
``heartbeat``, ``leave``, ``set_resident_model``, ``cancel_group``, ``forget_group``).
"""

SKIPPED_WHEN_EMPTY: frozenset[str] = frozenset().union(*(skip for _, skip in _CORE))
"""The core's operations declared ``@journaled(skip_when_empty=True)``, for reference: derived.

``SizeOneDispatcher``'s ``dispatch`` and ``expire``: a None or empty result changed nothing,
so the durable wrapper answers it without journaling. Each class's own declaration decides
(a fleet's ``expire`` is not so marked: it can time a silent worker out and return ``[]``).
"""


def sqlite_path(url: str) -> str:
    """The file a ``sqlite:`` URL names, by SQLAlchemy's convention.

    ``sqlite:///relative.db`` and ``sqlite:relative.db`` are relative to the working
    directory, ``sqlite:////abs/path.db`` (four slashes) is absolute. O(len(url)).

    Args:
        url: A URL starting with ``sqlite:``.

    Returns:
        The path (percent-escapes decoded).

    Raises:
        ValueError: Not a sqlite URL, a URL with a host (``sqlite://host/x``), or no path.
    """
    if not url.lower().startswith("sqlite:"):
        raise ValueError(f"not a sqlite URL: {url!r}")
    rest = unquote(url[len("sqlite:") :])
    if rest.startswith("//"):
        if not rest.startswith("///"):
            raise ValueError(
                f"a sqlite URL has no host: use sqlite:///relative.db or "
                f"sqlite:////absolute/path.db, got {url!r}"
            )
        rest = rest[3:]  # sqlite:///rel -> rel; sqlite:////abs -> /abs
    if not rest:
        raise ValueError(f"a sqlite URL must name a file, got {url!r}")
    return rest


def open_store(
    url: str | os.PathLike[str] | None = None,
    *,
    schema: str | None = None,
    synchronous: str = "full",
) -> Store:
    """Open (creating if needed) the store a URL names.

    Args:
        url: ``sqlite:////abs/path.db`` (four slashes: absolute), ``sqlite:///relative.db``
            or ``sqlite:relative.db`` (relative to the working directory), a plain file path, or
            ``postgresql://user@host:port/db`` (also ``postgres://``). None means
            ``prioqueue.db`` in the working directory.
        schema: PostgreSQL only: the schema holding the tables (created if missing).
        synchronous: SQLite only: ``"full"`` (fsync every commit, the default) or
            ``"normal"`` (survives a process crash, not a power loss); see
            :class:`SQLiteStore`.

    Returns:
        A :class:`SQLiteStore` or a :class:`PostgresStore`.

    Raises:
        ValueError: The URL's scheme is not sqlite or postgresql, or ``schema`` is given for
            SQLite.
        StoreError: The store cannot be opened (see its subclasses).
    """
    if url is None:
        url = default_path()
    url = os.fspath(url)
    if not isinstance(url, str) or not url:
        raise ValueError(f"url must be a non-empty str or path, got {url!r}")
    scheme = urlsplit(url).scheme.lower() if "://" in url or url.startswith("sqlite:") else ""
    if scheme in ("postgresql", "postgres"):
        if synchronous != "full":
            raise ValueError("synchronous applies to SQLite stores only")
        return PostgresStore(url, schema=schema)
    if schema is not None:
        raise ValueError("schema applies to PostgreSQL stores only")
    if scheme == "sqlite":
        return SQLiteStore(sqlite_path(url), synchronous=synchronous)
    if scheme:
        raise ValueError(
            f"unknown store scheme {scheme!r} in {url!r}; use sqlite:///relative.db, "
            "sqlite:////absolute/path.db or postgresql://..."
        )
    return SQLiteStore(url, synchronous=synchronous)
