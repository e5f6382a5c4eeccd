"""Journaled operations, declared where they are defined (private).

A method that changes state is marked ``@journaled``; a durable wrapper (``prioqueue.store``)
journals the calls of every method an object declares this way and knows none by name. The
core's dispatchers and the broker's engine use the same decorator.

``skip_when_empty=True`` says that a call returning None or an empty list changed nothing
(``SizeOneDispatcher.dispatch`` with nothing to grant), so a wrapper may answer it without
journaling. A subclass re-declares an inherited method by overriding it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, TypeVar, overload

import attrs

__all__: list[str] = []  # private module

_MARK = "__prioqueue_journaled__"

F = TypeVar("F", bound=Callable[..., Any])


@attrs.frozen
class JournaledOp:
    """One declared operation: its method name and whether an empty result skips the journal."""

    name: str
    skip_when_empty: bool = False


@overload
def journaled(method: F, /) -> F: ...
@overload
def journaled(*, skip_when_empty: bool = False) -> Callable[[F], F]: ...
def journaled(method: Any = None, /, *, skip_when_empty: bool = False) -> Any:
    """Mark a method as a journaled operation (``@journaled`` or ``@journaled(...)``).

    Raises:
        TypeError: What is decorated is not a function.
    """

    def mark(fn: F) -> F:
        if not callable(fn):
            raise TypeError(f"@journaled decorates a method, got {type(fn).__name__}")
        setattr(fn, _MARK, skip_when_empty)
        return fn

    return mark if method is None else mark(method)


_CACHE: dict[type, Mapping[str, JournaledOp]] = {}


def journaled_ops(cls: type) -> Mapping[str, JournaledOp]:
    """Return the operations ``cls`` declares (its own and inherited), by name.

    The most derived definition of a name decides: an override without the mark is not
    journaled. Complexity: O(attributes of the MRO) once per class, then O(1).
    """
    cached = _CACHE.get(cls)
    if cached is not None:
        return cached
    found: dict[str, JournaledOp] = {}
    seen: set[str] = set()
    for klass in cls.__mro__:
        for name, value in vars(klass).items():
            if name in seen:
                continue
            seen.add(name)
            mark = getattr(value, _MARK, None)
            if isinstance(mark, bool):
                found[name] = JournaledOp(name, skip_when_empty=mark)
    ops = _CACHE[cls] = MappingProxyType(dict(sorted(found.items())))
    return ops
