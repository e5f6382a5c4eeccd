"""Which calls are journaled, and how a journal is replayed (private).

An object's journaled operations are the methods its class declares with
``prioqueue._journaled.journaled`` (:func:`declared_ops`); the store knows none by name.
A dispatcher is rebuilt from a :class:`~prioqueue.store.Recovery` by restoring its snapshot
with times kept as they were (``restore(state)`` without ``now``) and calling every later
event again, by method name (a declared one, else the journal is corrupt), with the same
JSON arguments and the same ``now``. The core is deterministic, so the result is the state
the crashed process had after its last committed event. An event that raises on replay
means the journal and the code disagree: recovery stops with :class:`CorruptStore` rather
than serving a state that never existed.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any, Protocol, TypeVar

from prioqueue._journaled import journaled_ops
from prioqueue.store.base import Event, Recovery
from prioqueue.store.errors import CorruptStore

__all__ = ["Factory", "apply_event", "declared_ops", "dispatcher_factory", "replay"]


def declared_ops(cls: type) -> tuple[frozenset[str], frozenset[str]]:
    """The operations ``cls`` declares ``@journaled``: every name, and those skipped when empty.

    The store journals exactly these calls and knows no class by name: a method is journaled
    because its class marks it (``prioqueue._journaled``), not because the store lists it.
    O(attributes of the MRO) the first time per class, then O(operations).

    Returns:
        ``(names, skip_when_empty)``: the journaled method names, and the subset whose None
        or empty-list results changed nothing (answered without an event).
    """
    ops = journaled_ops(cls)
    return frozenset(ops), frozenset(name for name, op in ops.items() if op.skip_when_empty)


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
        CorruptStore: The snapshot does not restore, an event names a method the
            dispatcher's class does not declare ``@journaled``, or an event raises on replay.

    Complexity: O(snapshot + events x the cost of each call).
    """
    snapshot = recovery.snapshot
    try:
        dispatcher = factory(None if snapshot is None else snapshot.state)
    except (ValueError, TypeError, KeyError) as exc:
        where = "a fresh dispatcher" if snapshot is None else f"the snapshot at {snapshot.seq}"
        raise CorruptStore(f"cannot restore {where}: {exc}") from exc
    declared = frozenset(journaled_ops(type(dispatcher)))
    for event in recovery.events:
        apply_event(dispatcher, declared, event, event.args)
    return dispatcher


def apply_event(
    dispatcher: object, declared: frozenset[str], event: Event, args: Mapping[str, Any]
) -> None:
    """Call ``event`` again on ``dispatcher`` with ``args`` (the event's, or a fresh decoding).

    Raises:
        CorruptStore: The event names a method ``declared`` lacks, or it raises.
    """
    if event.op not in declared:
        if not event.op.isidentifier():
            raise CorruptStore(f"event {event.seq} names an invalid method {event.op!r}")
        raise CorruptStore(
            f"event {event.seq}: {type(dispatcher).__name__} has no method {event.op!r} "
            f"declared @journaled (it declares {', '.join(sorted(declared)) or 'none'})"
        )
    method = getattr(dispatcher, event.op)
    try:
        method(**args)
    except Exception as exc:
        raise CorruptStore(
            f"event {event.seq} ({event.op}) does not replay: {type(exc).__name__}: {exc}"
        ) from exc
