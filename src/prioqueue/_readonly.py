"""``ReadOnly``: a read-only attribute that shows another object's attribute (private).

For the many ``@property`` blocks that only return ``self._x`` or ``self._x.y``: one line
each, ``scorer = ReadOnly[Scorer]("_core.config.scorer", "The scorer (read-only).")``, instead of
five. The dispatchers' facade and the reference models use it.
"""

from __future__ import annotations

import operator
from typing import Any, Generic, NoReturn, TypeVar, cast, overload

__all__: list[str] = []  # private module

_T = TypeVar("_T")


class ReadOnly(Generic[_T]):
    """A read-only attribute whose value is ``instance.<path>`` (a dotted attribute path).

    Read through the class it is the descriptor itself (its ``__doc__`` is the attribute's
    documentation); setting or deleting it on an instance raises ``AttributeError``, as for a
    ``property`` without a setter. Reading costs one attribute look-up per dot.
    """

    def __init__(self, path: str, doc: str) -> None:
        self._get = operator.attrgetter(path)
        self._name = path
        self.__doc__ = doc

    def __set_name__(self, owner: type[Any], name: str) -> None:
        self._name = name

    @overload
    def __get__(self, instance: None, owner: type[Any] | None = None) -> ReadOnly[_T]: ...

    @overload
    def __get__(self, instance: object, owner: type[Any] | None = None) -> _T: ...

    def __get__(self, instance: object, owner: type[Any] | None = None) -> _T | ReadOnly[_T]:
        if instance is None:
            return self
        return cast("_T", self._get(instance))

    def __set__(self, instance: object, value: object) -> NoReturn:
        raise AttributeError(f"{self._name!r} of a {type(instance).__name__} is read-only")

    def __delete__(self, instance: object) -> NoReturn:
        self.__set__(instance, None)
