"""Which calls are journaled, and how a journal is replayed (private).

A dispatcher is rebuilt from a :class:`~prioqueue.store.Recovery` by restoring its snapshot
with times kept as they were (``restore(state)`` without ``now``) and calling every later event
again, by method name, with the same JSON arguments and the same ``now``. The core is
deterministic, so the result is the state the crashed process had after its last committed
event. An event that raises on replay means the journal and the code disagree: recovery
stops with :class:`CorruptStore` rather than serving a state that never existed.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any, Protocol, TypeVar

from prioqueue.store._base import Recovery
from prioqueue.store._errors import CorruptStore

__all__ = ["JOURNALED_OPS", "SKIPPED_WHEN_EMPTY", "Factory", "dispatcher_factory", "replay"]

#: Dispatcher methods whose calls change state, and so are journaled. ``SizeOneDispatcher``
#: has ``submit``, ``dispatch``, ``complete``, ``cancel``, ``expire`` and
#: ``set_resident_model``; the others are the fleet dispatcher's (``pop``, ``join``, ...) and
#: job groups' (``fail``, ``cancel_group``, ``forget_group``).
JOURNALED_OPS: frozenset[str] = frozenset(
    {
        "submit",
        "dispatch",
        "pop",
        "complete",
        "fail",
        "cancel",
        "expire",
        "join",
        "heartbeat",
        "leave",
        "set_resident_model",
        "cancel_group",
        "forget_group",
    }
)

#: Calls that change nothing when they return None or an empty list (``dispatch`` with
#: nothing to grant, ``expire`` with nothing due): they are answered, not journaled.
SKIPPED_WHEN_EMPTY: frozenset[str] = frozenset({"dispatch", "expire"})


class Restorable(Protocol):
    """What the store needs of a dispatcher: ``snapshot(now=)`` (restore is the factory's)."""

    def snapshot(self, *, now: float) -> dict[str, Any]: ...  # pragma: no cover


D = TypeVar("D")

#: ``state -> dispatcher``: a fresh one for None, else one restored with times kept.
Factory = Callable[[Mapping[str, Any] | None], D]


def dispatcher_factory(cls: Any, /, **options: Any) -> Callable[[Mapping[str, Any] | None], Any]:
    """Return a factory that makes ``cls(**options)`` or ``cls.restore(state, **options)``.

    The restore keeps every stored time as it was (no ``now`` shift), which replay needs.

    Args:
        cls: A dispatcher class with a ``restore(state, **options)`` classmethod.
        **options: The constructor's keyword arguments (scorer, lease_for, limits...).

    Raises:
        TypeError: ``cls`` has no ``restore`` classmethod.
    """
    if not callable(getattr(cls, "restore", None)):
        raise TypeError(f"{cls!r} has no restore() classmethod")

    def make(state: Mapping[str, Any] | None) -> Any:
        if state is None:
            return cls(**options)
        return cls.restore(state, **options)

    return make


def takes_now(dispatcher: object, op: str) -> bool:
    """Whether ``dispatcher.<op>`` has a ``now`` parameter (the wrapper stamps it)."""
    method = getattr(type(dispatcher), op, None)
    if method is None:
        return False
    try:
        return "now" in inspect.signature(method).parameters
    except (TypeError, ValueError):  # pragma: no cover - builtins without signatures
        return False


def replay(recovery: Recovery, factory: Callable[[Mapping[str, Any] | None], D]) -> D:
    """Rebuild the dispatcher a recovery describes: its snapshot, then every event after it.

    Args:
        recovery: What :meth:`Store.recover` returned.
        factory: Makes a fresh dispatcher (None) or restores a snapshot (see
            :func:`dispatcher_factory`).

    Returns:
        The dispatcher after the last event.

    Raises:
        CorruptStore: The snapshot does not restore, an event names an unknown method, or an
            event raises on replay.

    Complexity: O(snapshot + events x the cost of each call).
    """
    snapshot = recovery.snapshot
    try:
        dispatcher = factory(None if snapshot is None else snapshot.state)
    except (ValueError, TypeError, KeyError) as exc:
        where = "a fresh dispatcher" if snapshot is None else f"the snapshot at {snapshot.seq}"
        raise CorruptStore(f"cannot restore {where}: {exc}") from exc
    for event in recovery.events:
        if event.op not in JOURNALED_OPS and not event.op.isidentifier():
            raise CorruptStore(f"event {event.seq} names an invalid method {event.op!r}")
        method = getattr(dispatcher, event.op, None)
        if method is None or event.op.startswith("_") or not callable(method):
            raise CorruptStore(
                f"event {event.seq}: {type(dispatcher).__name__} has no method {event.op!r}"
            )
        try:
            method(**event.args)
        except Exception as exc:
            raise CorruptStore(
                f"event {event.seq} ({event.op}) does not replay: {type(exc).__name__}: {exc}"
            ) from exc
    return dispatcher
