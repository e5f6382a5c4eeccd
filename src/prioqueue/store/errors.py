"""The exceptions ``prioqueue.store`` raises.

Two families: :class:`StoreError` for a store that cannot be opened or recovered (the caller
fixes the store or its URL; nothing was changed), and :class:`StoreFatal` for a failure after
the dispatcher started serving (a commit failed, or another leader took over): the process
must stop, and the next start recovers from the store (crash-only).
"""

from __future__ import annotations

from prioqueue.errors import PrioqueueError

__all__ = [
    "CommitFailed",
    "CorruptStore",
    "Fenced",
    "SchemaVersionError",
    "StoreError",
    "StoreFatal",
    "StoreLocked",
]


class StoreError(PrioqueueError):
    """A store could not be opened, read or recovered; the message says what and where."""


class CorruptStore(StoreError):
    """The store's data is damaged; recovery stops and nothing is served.

    Raised for a file that is not a database, a truncated file, a gap in the journal,
    unreadable JSON, or an event that no longer replays.
    """


class SchemaVersionError(StoreError):
    """The store was written by a newer prioqueue (a higher schema version than this one reads).

    Attributes:
        found: The store's schema version.
        supported: The highest version this prioqueue reads.
    """

    def __init__(self, message: str, *, found: int, supported: int) -> None:
        super().__init__(message)
        self.found = found
        self.supported = supported


class StoreLocked(StoreError):
    """Another process holds the SQLite store (one writer per file)."""


class StoreFatal(PrioqueueError):
    """The durable dispatcher must stop: its in-memory state may be ahead of the store.

    Raised to every caller whose event was not committed, and to every later call. A service
    turns it into a process exit (``exit code 75``, say); the next start recovers from the
    store. Nothing is served after it.
    """


class CommitFailed(StoreFatal):
    """Writing a batch of journal events failed (disk full, connection lost, ...).

    The original exception is the ``__cause__``.
    """


class Fenced(StoreFatal):
    """Another broker took over the store (its epoch is newer): this one appended nothing.

    Attributes:
        epoch: The epoch this instance wrote with.
        current: The store's current epoch.
    """

    def __init__(self, message: str, *, epoch: int, current: int) -> None:
        super().__init__(message)
        self.epoch = epoch
        self.current = current
