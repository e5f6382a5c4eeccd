"""The broker's workers: the settings each pop stated and when each last spoke (issue 29).

Theory of operation
-------------------
The fleet dispatcher keeps the workers' runtime state (held jobs, resident model, liveness);
the broker keeps, in a :class:`WorkerBook`, what it needs beside it: each joined worker's
:class:`WorkerSettings` (the settings its last pop stated: a pop with other settings re-joins
it) and when a pop, heartbeat, complete or fail last named each worker (``seen``, least
recently seen first, so forgetting silent workers looks at the head only). Its fields are
private; the operation modules (:mod:`prioqueue.broker._workers`) change them through its
methods. The snapshot's ``workers`` and ``seen`` are written and read as before.

The rules it keeps (:meth:`WorkerBook.check`): ``seen`` is in time order, and every joined
worker has been seen (a worker stays seen after it leaves, until it is forgotten).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from prioqueue._readonly import ReadOnly
from prioqueue.broker._mapping import OwnedMapping

__all__ = ["WorkerBook", "WorkerSettings"]


@attrs.frozen
class WorkerSettings:
    """A worker's settings as its pop stated them (``BrokerEngine.pop``'s keywords).

    Attributes:
        models: The models it serves (None: any).
        resident: The model loaded on it, or None.
        slots: Jobs it may hold at once.
        slow: Whether it is extra slow.
        capabilities: What it can run (``Capabilities.as_dict()`` form), or None.
        legacy: The snapshot's settings as read, when they lack a setting added since: such
            settings equal no pop's (its next pop re-joins the worker) and are written back
            as they were read.
    """

    models: list[str] | None = None
    resident: str | None = None
    slots: int = 1
    slow: bool = False
    capabilities: dict[str, Any] | None = None
    legacy: dict[str, Any] | None = attrs.field(default=None, kw_only=True, repr=False)

    @classmethod
    def from_mapping(cls, spec: Mapping[str, Any]) -> WorkerSettings:
        """The settings of a pop (``records.pop_spec``) or of a snapshot's ``workers``. O(1).

        Raises:
            TypeError: An unknown setting.
        """
        settings = cls(**spec)
        if spec.keys() != _NAMES:
            return attrs.evolve(settings, legacy=dict(spec))
        return settings

    def as_dict(self) -> dict[str, Any]:
        """The JSON form the snapshot keeps (the keys in declaration order). O(1)."""
        if self.legacy is not None:
            return dict(self.legacy)
        return {name: getattr(self, name) for name in _ORDER}

    def join_args(self) -> dict[str, Any]:
        """The keywords of ``FleetDispatcher.join`` for these settings. O(1)."""
        return {name: getattr(self, name) for name in _ORDER}

    def with_resident(self, resident: str) -> WorkerSettings:
        """The same settings with ``resident`` loaded (a heartbeat that says so). O(1)."""
        legacy = None if self.legacy is None else {**self.legacy, "resident": resident}
        return attrs.evolve(self, resident=resident, legacy=legacy)


_ORDER = ("models", "resident", "slots", "slow", "capabilities")
_NAMES = frozenset(_ORDER)


class WorkerBook(OwnedMapping[str, WorkerSettings]):
    """The joined workers' settings, and when each worker last spoke.

    A read-only mapping of worker name -> :class:`WorkerSettings`, oldest join first;
    changed only through its methods.
    """

    def __init__(self) -> None:
        self._entries: dict[str, WorkerSettings] = {}
        self._seen: dict[str, float] = {}

    # ------------------------------------------------------------------ reads

    seen = ReadOnly[Mapping[str, float]](
        "_seen", "Worker -> when it last spoke, least recently seen first."
    )

    def oldest_seen(self) -> tuple[str, float] | None:
        """The least recently seen worker and when, or None. O(1)."""
        for name, seen in self._seen.items():
            return name, seen
        return None

    # ------------------------------------------------------------------ changes

    def join(self, name: str, settings: WorkerSettings) -> None:
        """``name`` joined (or re-joined) with ``settings``. O(1)."""
        self._entries[name] = settings

    def touch(self, name: str, now: float) -> None:
        """The worker spoke: it becomes the most recently seen. O(1)."""
        self._seen.pop(name, None)
        self._seen[name] = now

    def leave(self, name: str) -> bool:
        """``name`` left: its settings go (it stays seen); whether it had joined. O(1)."""
        return self._entries.pop(name, None) is not None

    def forget(self, name: str) -> bool:
        """``name`` was silent too long: it is not seen any more, and leaves. O(1).

        Returns:
            Whether it was joined (the caller makes it leave the fleet).
        """
        self._seen.pop(name, None)
        return self.leave(name)

    def shift(self, by: float) -> None:
        """Every last word moves ``by`` seconds earlier (a rebase). O(workers)."""
        self._seen = {name: t - by for name, t in self._seen.items()}

    def load(self, settings: Mapping[str, Mapping[str, Any]], seen: Mapping[str, float]) -> None:
        """Take a snapshot's ``workers`` and ``seen`` (least recently seen first).

        Raises:
            TypeError: A worker's settings name an unknown setting.

        Complexity: O(workers).
        """
        self._entries = {name: WorkerSettings.from_mapping(s) for name, s in settings.items()}
        self._seen = dict(seen)

    def check(self) -> None:
        """Assert the rules of the module docstring (for the tests). O(workers).

        Raises:
            AssertionError: A rule does not hold.
        """
        times = list(self._seen.values())
        assert times == sorted(times), "seen is out of order"
        missing = self._entries.keys() - self._seen.keys()
        assert not missing, f"joined but never seen: {sorted(missing)}"
